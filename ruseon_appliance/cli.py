"""The ``ruseon`` command: ``serve``, ``config``, ``check`` and ``admin-secret``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .config import Config, ConfigError, load_config, to_toml
from .config import flags as config_flags
from .logs import setup_logging
from .systemd_integration import LOG_PATHS, journal_handler


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """``--config``, the camera and relay lists, and every setting's flag from the config table
    (:func:`ruseon_appliance.config.flags`)."""
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML config file (default: $RUSEON_CONFIG or /etc/ruseon/ruseon.toml)",
    )
    parser.add_argument(
        "--camera", metavar="NAME=SOURCE", action="append",
        help="a camera named NAME (repeatable; these make the camera list; the first is "
             "the default one unless http.default_camera names another)",
    )
    parser.add_argument(
        "--relay", metavar="rtp://HOST:PORT",
        help="also send the camera's RTP to this media server (a relay named default)",
    )
    for section, key, row in config_flags():
        assert row.flag is not None
        parser.add_argument(row.flag.name, metavar=row.flag.metavar, help=row.doc,
                            dest=f"{section}.{key}",
                            action="append" if row.flag.repeat else "store")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``ruseon`` and ``python -m ruseon_appliance``."""
    parser = argparse.ArgumentParser(
        prog="ruseon", description="RUSEON Appliance: a LAN camera served over WHEP."
    )
    parser.add_argument("--version", action="version", version=f"ruseon {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the appliance")
    _add_config_flags(serve)
    show = commands.add_parser("config", help="print the effective configuration as TOML")
    _add_config_flags(show)
    show.add_argument("--show-secrets", action="store_true",
                      help="print the token, passwords and keys instead of hiding them")
    check = commands.add_parser("check", help="diagnose this machine; exit 0 when healthy")
    _add_config_flags(check)
    secret = commands.add_parser(
        "admin-secret", help="print this device's admin secret (made on first start)")
    _add_config_flags(secret)
    secret.add_argument("--rotate", action="store_true",
                        help="replace it with a new one: admin logins with the old one end")
    return parser


def admin_secret(config: Config, rotate: bool, out: Any = sys.stdout) -> int:
    """``ruseon admin-secret [--rotate]``: print (or first make, or replace) the admin secret."""
    from .access import secret as secret_file

    if config.auth.token or config.auth.token_file:
        where = "auth.token" if config.auth.token else f"auth.token_file ({config.auth.token_file})"
        if rotate:
            print(f"ruseon: error: the admin secret is set by {where} in the configuration; "
                  "change it there", file=sys.stderr)
            return 2
        out.write(config.auth.resolve_token() + "\n")
        return 0
    path = secret_file.secret_path(config.state.dir)
    try:
        if rotate:
            value = secret_file.new_secret()
            secret_file.write_secret(path, value)
            print(f"ruseon: a new admin secret is in {path}; the running service takes it "
                  "within seconds and ends admin logins made with the old one", file=sys.stderr)
        else:
            value, made = secret_file.ensure_secret(path)
            if made:
                print(f"ruseon: made this device's admin secret in {path}", file=sys.stderr)
    except OSError as exc:
        print(f"ruseon: error: {path}: {exc.strerror} (run it as root: sudo ruseon "
              "admin-secret)", file=sys.stderr)
        return 1
    out.write(value + "\n")
    return 0


def config_from_args(args: argparse.Namespace) -> Config:
    """Apply file, environment and the command line's flags, in that order."""
    flags: dict[str, dict[str, Any]] = {}

    if args.camera and getattr(args, "camera.source") is not None:
        # One rule, whatever the count: --source would otherwise quietly replace the source
        # a single --camera just named.
        raise ConfigError("--source and --camera cannot be used together: give each camera "
                          "its source as --camera NAME=SOURCE")
    if args.camera:
        flags["cameras"] = {"flags": args.camera}
    if args.relay is not None:
        flags["relay"] = {"url": args.relay}
    for section, key, row in config_flags():
        value = getattr(args, f"{section}.{key}")
        if value is not None and row.flag is not None:
            flags.setdefault(section, {}).update({key: value, **dict(row.flag.also)})
    return load_config(args.config, overrides=flags, required=args.config is not None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        if args.command == "config":
            sys.stdout.write(to_toml(config, hide_secrets=not args.show_secrets))
            return 0
        if args.command == "admin-secret":
            return admin_secret(config, args.rotate)
        # Under systemd, stderr is the journal: send structured fields instead of text.
        handler, log_path = journal_handler()
        setup_logging(config.log.level, handler=handler)
        logging.getLogger("ruseon").info("logging to %s", LOG_PATHS[log_path])
        if args.command == "check":
            from .diagnostics import run_checks

            return 0 if run_checks(config, sys.stdout) else 1
        from .app import serve

        return asyncio.run(serve(config))
    except ConfigError as exc:
        print(f"ruseon: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
