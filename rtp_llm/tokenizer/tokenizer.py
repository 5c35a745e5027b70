"""Tokenizer: a `tokenizers` Tokenizer plus the special tokens and chat template of a checkpoint.

Sources: a Hugging Face directory (tokenizer.json + tokenizer_config.json / chat_template.jinja),
or a GGUF file, whose metadata carries the vocabulary, merges, token types and chat template; the
byte-level BPE tokenizer is rebuilt from them here.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from rtp_llm.errors import CheckpointError, MissingFileError
from rtp_llm.tokenizer import chat_template as _templates

# tokenizer.ggml.pre -> the split regex the merges were learned with (byte-level BPE vocabularies).
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GGUF_SPLITS = {"qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
                "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT}
_CONTROL, _USER_DEFINED = 3, 4


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _token_content(tok: Any) -> Optional[str]:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


class Tokenizer:
    def __init__(self, backend: Backend, chat_template: Optional[str] = None, bos_token: Optional[str] = None,
                 eos_token: Optional[str] = None, add_bos: bool = False, extra_special: Optional[dict] = None):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = backend.token_to_id(eos_token) if eos_token else None
        self.extra_special = extra_special or {}

    # --- loading -------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        """From a HF directory, a .gguf file, or a directory holding one .gguf."""
        from rtp_llm.models.loader import find_gguf

        if os.path.isdir(path) and os.path.isfile(os.path.join(path, "tokenizer.json")):
            return cls.from_hf_dir(path)
        gguf_path = find_gguf(path)
        if gguf_path:
            return cls.from_gguf(gguf_path)
        raise MissingFileError(f"no tokenizer in {path}: expected tokenizer.json or a .gguf file")

    @classmethod
    def from_hf_dir(cls, path: str) -> "Tokenizer":
        backend = Backend.from_file(os.path.join(path, "tokenizer.json"))
        cfg: dict[str, Any] = {}
        cfg_path = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_path):
            with open(cfg_path) as f:
                cfg = json.load(f)
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_path = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            with open(jinja_path) as f:
                template = f.read()
        # The backend's post-processor already adds BOS where the model wants it.
        return cls(backend, template, _token_content(cfg.get("bos_token")), _token_content(cfg.get("eos_token")),
                   add_bos=False)

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        from rtp_llm.models.gguf_reader import open_gguf

        f = open_gguf(path)
        kind = f.field("tokenizer.ggml.model")
        if kind != "gpt2":
            raise CheckpointError(f"{path}: GGUF tokenizer type {kind!r} is not supported (supported: gpt2 byte-level BPE)")
        tokens = list(f.field("tokenizer.ggml.tokens"))
        types = list(f.field("tokenizer.ggml.token_type") or [])
        merges = [tuple(m.split(" ", 1)) for m in f.field("tokenizer.ggml.merges") or []]
        spelling = _bytes_to_unicode()
        alphabet = set(spelling.values())
        vocab = {}
        for i, t in enumerate(tokens):
            # A byte-level vocabulary spells every token in the byte alphabet; respell any that is not.
            key = t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
            vocab.setdefault(key, i)
        backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        split = _GGUF_SPLITS.get(f.field("tokenizer.ggml.pre"))
        if split is None:
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
        backend.decoder = decoders.ByteLevel()
        control = [AddedToken(t, normalized=False, special=True)
                   for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= alphabet]
        backend.add_special_tokens(control)
        user = [AddedToken(t, normalized=False, special=False)
                for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab]
        if user:
            backend.add_tokens(user)

        def tok(key):
            idx = f.field(key)
            return tokens[int(idx)] if idx is not None and int(idx) < len(tokens) else None

        return cls(backend, f.field("tokenizer.chat_template"), tok("tokenizer.ggml.bos_token_id"),
                   tok("tokenizer.ggml.eos_token_id"), add_bos=bool(f.field("tokenizer.ggml.add_bos_token", False)),
                   extra_special={"unk_token": tok("tokenizer.ggml.unknown_token_id"),
                                  "pad_token": tok("tokenizer.ggml.padding_token_id")})

    # --- use -----------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids
        return ids

    def encode_pair(self, first: str, second: str) -> list[int]:
        """A text pair as a cross-encoder reads it: the tokenizer's own pair template (BERT's [CLS] a [SEP] b [SEP];
        a concatenation for byte-level BPE tokenizers without one), as transformers' tokenizer(a, b) gives it."""
        ids = self.backend.encode(first, second, add_special_tokens=True).ids
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> Optional[str]:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            chat_template: Optional[str] = None, **variables) -> str:
        """chat_template: another template than the model's (transformers' argument of that name)."""
        source = chat_template or self.chat_template
        if not source:
            raise _templates.ChatTemplateError("this model has no chat template; use the completions API")
        special = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "",
                   **{k: v or "" for k, v in self.extra_special.items()}}
        return _templates.render(source, messages, add_generation_prompt, **{**special, **variables})
