"""Several processes: the script's Trainer trained by N ranks under torch.distributed.run (the `distributed` stage).

`processes` starts the job and reads what each rank recorded; `rank` is one rank (`python -m
pytest_trainer.distributed.rank JOB`); `sharding` checks an FSDP state dict through `fully_shard`; `judges` tells,
from the records alone, what only exists with several processes (a rank that died, different data, a hang, ranks
that drift apart, files written twice).
"""
