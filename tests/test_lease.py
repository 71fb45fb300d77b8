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
