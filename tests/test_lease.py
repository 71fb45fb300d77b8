"""The cluster lease object against a real S3 endpoint (moto's server): a renewal whose own
earlier write landed unseen is not mistaken for a takeover; a real takeover still is."""
import pytest

from agentos.config import S3Config
from storage.s3 import LeaseLost, ObjectStore


def test_a_renewal_after_its_own_unseen_write_goes_on_and_a_takeover_is_still_lost(s3):
    bucket = s3.new_bucket()
    store = ObjectStore(S3Config(bucket=bucket), s3=s3.client())
    lease = store.write_lease("node-a", 1, 10.0, None)
    # A renewal reached the bucket but its answer did not reach us (the connection was cut): the
    # lease has an ETag we never saw.
    landed = store._put_lease("node-a", 1, 10.0, lease.etag)
    assert landed.etag != lease.etag
    renewed = store.write_lease("node-a", 1, 10.0, lease.etag)
    assert store.read_lease().etag == renewed.etag != landed.etag
    # Another node takes over (as a standby does once the lease has expired): ours is lost.
    store._put_lease("node-b", 2, 10.0, renewed.etag)
    with pytest.raises(LeaseLost):
        store.write_lease("node-a", 1, 10.0, renewed.etag)
    # and a node that never held it cannot create it while it exists
    with pytest.raises(LeaseLost):
        store.write_lease("node-c", 1, 10.0, None)


def test_a_renewal_too_slow_to_leave_any_permission_is_made_again_not_taken_for_lost(monkeypatch):
    """A renewal that took longer than the lease grants (ttl - SAFETY_SECS) told the writers 0 s
    of permission, which they read as the lease lost: every append refused for good, on a node
    nobody took the lease from (after a supervisor stalled 5 s, the whole suite running)."""
    import asyncio
    import time
    from types import SimpleNamespace

    from agentos import lease as lease_module
    from agentos.config import Config
    from storage.s3 import Lease

    config = Config()
    config.cluster.lease_renew_secs, config.cluster.lease_ttl_secs = 0.01, 1.2   # 0.2 s to acknowledge in
    slow = [0.3, 0.0]                        # the first renewal takes longer than that, the next is quick

    def write_lease(node, epoch, ttl, etag):
        time.sleep(slow.pop(0) if slow else 0.0)
        return Lease(node, epoch, time.time() + ttl, f"e{len(slow)}")

    keeper = lease_module.LeaseKeeper(config, store=SimpleNamespace(write_lease=write_lease))
    keeper.lease = Lease("n", 1, time.time() + 1.2, "e")
    told = []

    async def lost():
        told.append("lost")

    async def go():
        task = asyncio.ensure_future(keeper.keep(lambda epoch, valid: told.append(valid), lost))
        while not told:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(asyncio.wait_for(go(), 10))
    assert len(told) == 1 and told[0] > 0       # the slow one told nothing; the quick one its permission
