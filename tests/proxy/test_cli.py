"""The `orchard proxy` commands: registered on the main CLI, --no-auth refused off loopback, export errors."""

from __future__ import annotations

import pytest

from orchard.cli import build_parser


def test_commands_are_registered():
    args = build_parser().parse_args(["proxy", "serve", "--upstream", "http://u", "--no-auth", "--host", "0.0.0.0"])
    assert args.command == "serve" and args.no_auth


def test_no_auth_is_refused_off_loopback(capsys):
    args = build_parser().parse_args(["proxy", "serve", "--upstream", "http://u", "--no-auth", "--host", "0.0.0.0"])
    assert args.func(args) == 2
    assert "loopback" in capsys.readouterr().err


def test_export_of_a_missing_store_fails_cleanly(tmp_path, capsys):
    args = build_parser().parse_args(["proxy", "export", "--store", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    assert args.func(args) == 2 and "not a proxy store" in capsys.readouterr().err


def test_bench_runs_and_prints_its_figures(capsys):
    import json

    args = build_parser().parse_args(["proxy", "bench", "--latency-calls", "20", "--sessions", "8",
                                      "--calls-per-session", "40", "--durability", "flush", "--upstream-delay-ms", "0", "5",
                                      "--json"])
    assert args.func(args) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["upstream_delay_ms"] for r in runs] == [0.0, 5.0]
    for figures in runs:
        for key in ("added_p50_ms", "proxy_p99_ms", "direct_calls_per_s", "proxy_calls_per_s", "throughput_ratio",
                    "upstream_cpu_ms_per_call", "proxy_to_upstream_cpu"):
            assert figures[key] > 0 or key == "added_p50_ms"
        assert 0 < figures["cpu_bound_ratio"] < 1


def test_bench_refuses_a_negative_delay():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["proxy", "bench", "--upstream-delay-ms", "-5"])
