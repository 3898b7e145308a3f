"""python3 -m knod: where a Python user of knod starts (the examples, the docs, the library)."""
from __future__ import annotations

import argparse
import sys

EXAMPLES = "/usr/share/doc/python3-knod/examples"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m knod",
        description="knod: register GPU buffers with knod-policyd and wait for the NIC's data "
                    "to land in them (the C client library, libknod-client.so.1, through ctypes).",
        epilog=f"""start here:
  {EXAMPLES}/receive.py      the article's example against the sim driver:
      python3 {EXAMPLES}/receive.py --flow 'udp 10.99.0.0/24:* -> 10.99.0.2:5000'
  {EXAMPLES}/ddp_train.py    the second: init_process_group(backend='knod'), a DDP job whose
      every rank receives through its own binding (import knod.distributed; --launch N runs
      a whole job on the sim as root, with {EXAMPLES}/collectives_policy.toml)
  pydoc3 knod                  every class and function, with units and errors
  knod-policy explain --user $USER ...   which rule would decide your request, and why
  docs: client-sdk.md and collectives.md in the project (the SDK; the torch backend);
  man knod-policy(1)""",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true",
                        help="print the package's and the loaded library's versions")
    args = parser.parse_args(argv)
    if args.version:
        import knod
        try:
            library = knod.library_version()
        except OSError as e:  # libknod-client.so.1 not installed
            print(f"knod (python): library not loaded: {e}", file=sys.stderr)
            return 1
        print(f"libknod-client {library}")
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
