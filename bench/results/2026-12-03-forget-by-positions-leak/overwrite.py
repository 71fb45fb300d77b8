"""ROUNDS x (500 agents x 20 tasks) of checkpoints on the same agents, against a running server."""
import asyncio, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.checkpoint_targets import AgentOSTarget
from bench.checkpoint_workload import BenchConfig, make_payloads
async def main(rounds):
    cfg = BenchConfig(); tgt = AgentOSTarget("http://127.0.0.1:18090", 60.0)
    cs = [await tgt.open_worker() for _ in range(10)]; pl = make_payloads(20, cfg)
    for r in range(rounds):
        it = iter(range(500))
        async def loop(c):
            for a in it:
                for j in range(20):
                    await c.commit(f"ow-{a}", j, pl[j])
        await asyncio.gather(*(loop(c) for c in cs)); print("round", r, flush=True)
        await asyncio.sleep(2)
asyncio.run(main(int(sys.argv[1])))
