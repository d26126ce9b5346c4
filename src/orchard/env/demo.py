"""`orchard env demo`: start the service, create a sandbox, run commands, show results, clean up."""

from __future__ import annotations

import argparse

from orchard.client.sync import SandboxClient
from orchard.env.runner import ServiceProcess

STEPS = [
    "uname -n && id -u && cat /etc/os-release | head -1",
    "echo 'print(sum(range(10)))' > /workspace/hello.py && python3 /workspace/hello.py",
    "ls / && (ip -o link 2>/dev/null || cat /proc/net/dev | tail -n +3 | cut -d: -f1)",
]


def main(args: argparse.Namespace) -> int:
    with ServiceProcess(args=["--no-auth"]) as service:
        print(f"service up at {service.url} (state in {service.state_dir})")
        with SandboxClient(base_url=service.url) as client:
            with client.create_sandbox(args.image) as sandbox:
                print(f"sandbox {sandbox.sandbox_id} ready (image {args.image})")
                for command in STEPS:
                    result = sandbox.exec(command, timeout=30)
                    print(f"\n$ {command}\n{result.stdout}{result.stderr}[exit {result.exit_code}]")
                sandbox.upload_content(b"uploaded through the API\n", "notes/readme.txt")
                print("\ndownloaded:", sandbox.download_content("notes/readme.txt").decode().strip())
                slow = sandbox.exec("sleep 5", timeout=1)
                print(f"timeout check: status={slow.status} exit={slow.exit_code} error={slow.error!r}")
        print("\nsandbox deleted, service stopping")
    return 0
