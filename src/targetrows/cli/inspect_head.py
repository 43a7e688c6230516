"""`targetrows inspect-head DIR_OR_ID [--target T]`: what an EAGLE-3 head is and how it will be
read (`targetrows.heads.describe`), before a long run: layout, feature layers, draft
vocabulary, variants, embedding, tensors, and whether it fits --target."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("head", metavar="DIR_OR_ID", help="head folder or Hugging Face hub id")
    parser.add_argument("--target", default=None,
                        help="target folder or hub id: check the head fits it (its config only)")
    parser.add_argument("--no-weights", dest="weights", action="store_false",
                        help="read config.json only (a hub id downloads no weights)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="let the target's config run code shipped with it")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from targetrows.heads.describe import describe, format_description

    target_config = None
    if args.target:
        from transformers import AutoConfig

        target_config = AutoConfig.from_pretrained(args.target,
                                                   trust_remote_code=args.trust_remote_code)
    info = describe(args.head, target_config, args.weights)
    print(json.dumps(info, indent=1) if args.json else format_description(info))
    return 0 if str(info.get("fits the target", "yes")).startswith("yes") else 1
