"""One scoring chunk's log-probs, entropy and backward at SmolLM2's shapes (8 rows, 47
positions, 49152 tokens, temperature 0.7): autograd's own chain against _gather_logprobs (the
one-buffer backward), process CPU ms and minor page faults of each, three times, one thread.

    taskset -c 0 python results/logprob-backward/micro.py
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

import torch

from cmlrl_agents.policies.logprobs import _gather_logprobs

TEMPERATURE = torch.full((8, 1, 1), 0.7)


def autograd_chain(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The code before the one-buffer backward: division, logsumexp, gather, and the entropy."""
    part = logits / TEMPERATURE
    lse = part.logsumexp(dim=-1)
    with torch.no_grad():
        (lse - (torch.softmax(part, dim=-1) * part).sum(dim=-1)).sum()
    return part.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse


def one_buffer(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return _gather_logprobs(logits, targets, None, TEMPERATURE, entropy=True).logprobs


def main() -> None:
    torch.set_num_threads(1)
    targets = torch.randint(0, 49152, (8, 47))
    sides: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "autograd chain": autograd_chain,
        "fused": one_buffer,
    }
    for _ in range(3):
        for name, scores in sides.items():
            logits = torch.randn(8, 47, 49152, requires_grad=True)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.process_time()
            scores(logits, targets).sum().backward()
            ms = (time.process_time() - start) * 1e3
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            print(name, round(ms), "ms", faults, "faults")


if __name__ == "__main__":
    main()
