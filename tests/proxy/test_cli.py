"""The `orchard proxy` commands: registered on the main CLI, --no-auth refused off loopback, export errors."""

from __future__ import annotations

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

    args = build_parser().parse_args(["proxy", "bench", "--latency-calls", "20", "--sessions", "4",
                                      "--calls-per-session", "3", "--durability", "flush", "--json"])
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    for key in ("added_p50_ms", "proxy_p99_ms", "direct_calls_per_s", "proxy_calls_per_s", "throughput_ratio",
                "proxy_cpu_ms_per_call"):
        assert figures[key] > 0 or key == "added_p50_ms"
