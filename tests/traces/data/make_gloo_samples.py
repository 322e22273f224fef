import os, sys, torch, torch.nn as nn, torch.distributed as dist
from torch.profiler import profile, ProfilerActivity, schedule
strategy = sys.argv[1]; out = sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0); torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
if strategy == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(model, bucket_cap_mb=0.05)
elif strategy == "fsdp":
    from torch.distributed.fsdp import fully_shard
    fully_shard(model[0]); fully_shard(model[2]); fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(16, 64)
os.makedirs(out, exist_ok=True)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2), record_shapes=True,
             on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.json.gz")) as p:
    for i in range(4):
        model(x).pow(2).mean().backward(); opt.step(); opt.zero_grad(); p.step()
dist.destroy_process_group()
