"""plan.toml text for the Python tests that emit plans
(framework_keys_test.py, tests/frameworks/): the keys docs/recipes.md
documents, the global batch micro x accumulation."""


def plan_toml(micro, accum, checkpoint, optimizer, offload, precision, device, job="job", lr=3e-4,
              weight_decay=0.01, betas=(0.9, 0.95), eps=1e-08, momentum=0.0, parameters=None, max_grad_norm=0.0):
    """parameters: the trainable parameter count ([job] parameters), or None
    for a plan written before the key."""
    count = "" if parameters is None else f"parameters = {parameters}\n"
    return f"""plan_version = 1
[job]
spec = "{job}.toml"
model = "{job}.pt"
device = "{device}"
global_batch = {micro * accum}
{count}[config]
micro_batch = {micro}
accumulation_steps = {accum}
checkpoint = "{checkpoint}"
optimizer = "{optimizer}"
offload_optimizer = {str(offload).lower()}
precision = "{precision}"
[optimizer]
lr = {lr}
weight_decay = {weight_decay}
betas = [{betas[0]}, {betas[1]}]
eps = {eps}
momentum = {momentum}
max_grad_norm = {max_grad_norm}
"""
