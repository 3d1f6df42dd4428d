"""Generated workloads: chat-templated token prompts built from a synthetic but natural document."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

WORKLOADS = ("single", "shared-prefix", "three-documents", "no-sharing", "long-decode")

_NAMES = ["Alvarez", "Brennan", "Chandra", "Dubois", "Eriksen", "Fujita", "Garcia", "Haddad", "Ivanova", "Jensen",
          "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov", "Quinn", "Rossi", "Santos", "Tanaka"]
_TEAMS = ["logistics", "billing", "customer support", "research", "procurement", "quality assurance",
          "marketing", "security", "facilities", "legal"]
_EVENTS = ["a delayed shipment", "a pricing error", "a server outage", "a supplier dispute", "a safety inspection",
           "a product recall", "a contract renewal", "an audit finding", "a hiring freeze", "a data migration"]
_OUTCOMES = ["was resolved within two days", "is still under review", "cost the company about {n} thousand euros",
             "was escalated to the board", "led to a new written procedure", "affected {n} customers",
             "was closed without further action", "required {n} hours of overtime"]
_TOPICS = ["tide pools", "paper airplanes", "sourdough bread", "the first bicycle", "volcanic islands", "honeybees",
           "lighthouses", "chess openings", "desert plants", "the printing press", "glaciers", "origami cranes",
           "coral reefs", "steam engines", "night markets", "migrating geese", "sundials", "rainforest frogs",
           "ancient libraries", "wind turbines", "jazz drumming", "mountain railways", "solar eclipses", "tea ceremonies",
           "lunar craters", "hot air balloons", "octopus camouflage", "city gardens", "salt flats", "kite festivals",
           "deep sea vents", "maple syrup", "snow leopards", "river deltas", "clock towers", "street murals"]
_ROLES = ["Poet", "Historian", "Gardener", "Engineer", "Sailor", "Chef", "Teacher", "Geologist", "Pilot", "Librarian",
          "Painter", "Biologist", "Architect", "Detective", "Astronomer", "Carpenter", "Journalist", "Farmer",
          "Musician", "Explorer", "Pharmacist", "Mechanic", "Translator", "Photographer", "Diver", "Baker",
          "Cartographer", "Beekeeper", "Potter", "Ranger", "Tailor", "Weaver", "Glassblower", "Surveyor", "Jeweler",
          "Clockmaker"]
_LABELS = "urgent, routine, financial, operational or legal"
_LABEL_SYSTEM = f"You label internal incident reports. Answer with one word: {_LABELS}."


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]  # token ids, chat template applied
    max_tokens: int
    description: str
    chats: list[tuple[str, str]] = field(default_factory=list)  # (system, user) per prompt, for request files

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def shared_prefix_tokens(self) -> int:
        """Longest prefix common to all prompts (the part a prefix cache can reuse)."""
        return _common_prefix(self.prompts)

    def max_pairwise_prefix_tokens(self) -> int:
        return max((common_prefix_len(a, b) for i, a in enumerate(self.prompts) for b in self.prompts[i + 1:]), default=0)

    def stats(self) -> dict:
        lengths = [len(p) for p in self.prompts]
        return {"requests": len(self.prompts), "max_tokens": self.max_tokens, "prompt_tokens": sum(lengths),
                "prompt_len_min": min(lengths), "prompt_len_max": max(lengths),
                "shared_prefix_tokens": self.shared_prefix_tokens(),
                "max_pairwise_prefix_tokens": self.max_pairwise_prefix_tokens(), "description": self.description}


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _common_prefix(prompts: list[list[int]]) -> int:
    return min((common_prefix_len(prompts[0], p) for p in prompts[1:]), default=len(prompts[0]) if prompts else 0)


def _encode_chat(tokenizer, system: str, user: str) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _sentence(rng: random.Random) -> str:
    outcome = rng.choice(_OUTCOMES).format(n=rng.randint(3, 90))
    return (f"In week {rng.randint(1, 52)}, {rng.choice(_NAMES)} from the {rng.choice(_TEAMS)} team reported "
            f"{rng.choice(_EVENTS)}, which {outcome}.")


def _document(tokenizer, rng: random.Random, system: str, shared_tokens: int) -> str:
    """Add sentences, then words, until the shared part of the prompt reaches shared_tokens."""
    words: list[str] = []
    while len(_encode_chat(tokenizer, system, _doc_user(" ".join(words), ""))) < shared_tokens + 8:
        words.extend(_sentence(rng).split())
    while len(words) > 1 and _shared_len(tokenizer, system, " ".join(words)) > shared_tokens:
        words.pop()
    return " ".join(words)


def _doc_user(document: str, question: str) -> str:
    return f"Document:\n{document}\n\nQuestion: {question}"


def _shared_len(tokenizer, system: str, document: str) -> int:
    a = _encode_chat(tokenizer, system, _doc_user(document, "Which label fits?"))
    b = _encode_chat(tokenizer, system, _doc_user(document, "Pick one label."))
    return common_prefix_len(a, b)


def shared_prefix(tokenizer, requests: int = 32, max_tokens: int = 8, seed: int = 0,
                  shared_tokens: int = 370) -> Workload:
    """The document-to-label case: one long document, many short questions about it."""
    rng = random.Random(seed)
    document = _document(tokenizer, rng, _LABEL_SYSTEM, shared_tokens)
    chats = [(_LABEL_SYSTEM, _doc_user(document, _question(rng, i))) for i in range(requests)]
    description = f"one document, ~{shared_tokens} shared tokens, a short question each"
    return _workload("shared-prefix", tokenizer, chats, max_tokens, description)


def three_documents(tokenizer, requests: int = 96, max_tokens: int = 8, seed: int = 0,
                    shared_tokens: int = 370) -> Workload:
    """Three documents, questions interleaved (doc 0, 1, 2, 0, ...): file order never repeats a prefix."""
    rng = random.Random(seed + 3)
    documents = [_document(tokenizer, rng, _LABEL_SYSTEM, shared_tokens) for _ in range(3)]
    chats = [(_LABEL_SYSTEM, _doc_user(documents[i % 3], _question(rng, i))) for i in range(requests)]
    description = f"three documents of ~{shared_tokens} tokens, questions interleaved"
    return _workload("three-documents", tokenizer, chats, max_tokens, description)


def single(tokenizer, requests: int = 1, max_tokens: int = 1, seed: int = 0) -> Workload:
    """One short request, one output token: start-up dominates a whole process."""
    chats = [("You answer briefly.", f"What is {i + 2} + {i + 2}?") for i in range(requests)]
    return _workload("single", tokenizer, chats, max_tokens, "one short request")


def _question(rng: random.Random, i: int) -> str:
    return f"{rng.choice(_NAMES)}, week {rng.randint(1, 52)}, case {i}?"


def _workload(name: str, tokenizer, chats: list[tuple[str, str]], max_tokens: int, description: str) -> Workload:
    prompts = [_encode_chat(tokenizer, system, user) for system, user in chats]
    return Workload(name, prompts, max_tokens, description, chats)


def no_sharing(tokenizer, requests: int = 32, max_tokens: int = 40, seed: int = 0) -> Workload:
    """Short prompts with distinct system messages, so no two share more than the template's first tokens."""
    rng = random.Random(seed + 1)
    roles, topics = rng.sample(_ROLES, len(_ROLES)), rng.sample(_TOPICS, len(_TOPICS))
    chats = [(f"{roles[i % len(roles)]} {i}: you explain things in plain words.",
              f"Tell me something interesting about {topics[(i * 7) % len(topics)]}.") for i in range(requests)]
    return _workload("no-sharing", tokenizer, chats, max_tokens, "short distinct prompts")


def long_decode(tokenizer, requests: int = 4, max_tokens: int = 128, seed: int = 0) -> Workload:
    rng = random.Random(seed + 2)
    roles, topics = rng.sample(_ROLES, len(_ROLES)), rng.sample(_TOPICS, len(_TOPICS))
    chats = [(f"{roles[i % len(roles)]} {i}: you write long, detailed answers.",
              f"Write a detailed essay about {topics[i % len(topics)]}.") for i in range(requests)]
    return _workload("long-decode", tokenizer, chats, max_tokens, "a few prompts, long outputs")


_BUILDERS = {"single": single, "shared-prefix": shared_prefix, "three-documents": three_documents,
             "no-sharing": no_sharing, "long-decode": long_decode}
_SHARED = ("shared-prefix", "three-documents")


def build(name: str, tokenizer, requests: int | None = None, max_tokens: int | None = None,
          seed: int = 0, shared_tokens: int = 370) -> Workload:
    kwargs = {"seed": seed} | ({"shared_tokens": shared_tokens} if name in _SHARED else {})
    if requests is not None:
        kwargs["requests"] = requests
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    return _BUILDERS[name](tokenizer, **kwargs)
