"""Eager PyTorch's allocations read from the profiler (torch.profiler,
profile_memory=True), each with the aten operators around it: what
grad_scaler_reference.py and clip_grad_reference.py compare oomtune's
allocations with."""


def annotated_events(prof):
    """[(time ns, signed bytes, address, [enclosing operators, outermost
    first])] of every allocation and free, in time order (the profiler's
    event tree), and the times the optimizer's steps began."""
    events, step_starts = [], []

    def walk(node, around):
        if str(node.tag).endswith("Allocation"):
            f = node.extra_fields
            events.append((node.start_time_ns, f.alloc_size, f.ptr, around))
            return
        if node.name.startswith("Optimizer.step"):
            step_starts.append(node.start_time_ns)
        for child in node.children:
            walk(child, around + [node.name])

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, [])
    return sorted(events, key=lambda e: e[0]), step_starts


def is_python_number(nbytes, around):
    """Whether an allocation is a Python number wrapped as a CPU tensor
    (outside any operator) or its dtype conversion inside the arithmetic
    operator (an aten::to inside aten::add or aten::mul): host memory when
    the other operand is on a GPU."""
    if nbytes > 0 and not around:
        return True
    return bool(around) and around[0] in ("aten::add", "aten::mul") and "aten::to" in around
