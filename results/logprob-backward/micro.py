"""One scoring chunk's log-probs, entropy and backward at SmolLM2's shapes (8 rows, 47
positions, 49152 tokens, temperature 0.7): autograd's own chain against _gather_logprobs (the
one-buffer backward), process CPU ms and minor page faults of each, three times, one thread.

    taskset -c 0 python results/logprob-backward/micro.py
"""
import time, torch, resource
torch.set_num_threads(1)
from cmlrl_agents.policies.logprobs import _gather_logprobs
def chain(logits, targets, T, entropy):
    part = logits / T
    lse = part.logsumexp(dim=-1)
    lp = part.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        e = lse - (torch.softmax(part, dim=-1) * part).sum(dim=-1)
    return lp
T = torch.full((8, 1, 1), 0.7)
targets = torch.randint(0, 49152, (8, 47))
for rep in range(3):
    for name, f in (("autograd chain", lambda x: chain(x, targets, T, True)), ("fused", lambda x: _gather_logprobs(x, targets, None, T, True).logprobs)):
        x = torch.randn(8, 47, 49152, requires_grad=True)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.process_time()
        f(x).sum().backward()
        print(name, round((time.process_time()-t0)*1e3), "ms", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, "faults")
