"""A Hugging Face tokenizer directory built from a GGUF file's own vocabulary, offline.

Benchmark tools that generate prompts of a given length in tokens (aiperf) want a tokenizer they
can load with ``transformers``; the hub is not reachable from every machine, but the GGUF the
embedded model runs from carries the whole tokenizer. This rebuilds it for byte-level BPE
(``tokenizer.ggml.model == "gpt2"``: SmolLM2 and most Llama-family GGUFs) without torch, giving
the same token ids as ``transformers``' own GGUF loader.

It runs with the tool's Python, not the project's (it needs ``gguf``, ``tokenizers`` and
``transformers``, none of which the project depends on):

    var/bench-tools/aiperf-0.13.0/bin/python benchmarks/gguf_tokenizer.py MODEL.gguf OUT_DIR
"""

import argparse
from pathlib import Path
from typing import Any

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

#: ``tokenizer.ggml.token_type`` of a control token (``<|im_start|>``, ``<|endoftext|>``).
CONTROL = 3


def tokenizer_from_gguf(gguf_path: Path) -> PreTrainedTokenizerFast:
    """The tokenizer stored in ``gguf_path``; ValueError for a model that is not byte-level BPE."""
    reader = GGUFReader(str(gguf_path))

    def field(name: str) -> Any:
        found = reader.fields.get(name)
        return None if found is None else found.contents()

    kind = field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{gguf_path}: tokenizer model {kind!r}, only 'gpt2' (byte-level BPE)")
    tokens: list[str] = field("tokenizer.ggml.tokens")
    types: list[int] = field("tokenizer.ggml.token_type")
    merges = [tuple(merge.split(" ", 1)) for merge in field("tokenizer.ggml.merges")]
    bpe = Tokenizer(
        models.BPE(
            vocab={token: i for i, token in enumerate(tokens)},
            merges=merges,
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, kind in zip(tokens, types, strict=True)
            if kind == CONTROL
        ]
    )

    def token(name: str) -> str | None:
        index = field(name)
        return None if index is None else tokens[index]

    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        unk_token=token("tokenizer.ggml.unknown_token_id"),
        pad_token=token("tokenizer.ggml.padding_token_id"),
    )
    if template := field("tokenizer.chat_template"):
        fast.chat_template = template
    return fast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path, help="the directory to write (created)")
    args = parser.parse_args()
    fast = tokenizer_from_gguf(args.gguf)
    fast.save_pretrained(str(args.out))
    print(f"{len(fast)} tokens from {args.gguf.name}")


if __name__ == "__main__":
    main()
