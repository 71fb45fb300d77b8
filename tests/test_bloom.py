"""The Bloom filter writer/store uses to answer "no checkpoint" without a scan."""
import pytest

from storage.bloom import BloomFilter


def test_a_member_is_always_found_and_most_strangers_are_not():
    bloom = BloomFilter(bits=1 << 16, hashes=7)
    members = [f"agent:s{i:05d}" for i in range(5000)]
    news = [bloom.add(key) for key in members]
    assert all(key in bloom for key in members)
    # add() says whether a key was new: a member added again is not (a stranger may be a "maybe")
    assert sum(news) > 4900 and not any(bloom.add(key) for key in members[:10])
    later = BloomFilter(bits=1 << 16, hashes=7)   # past the recent keys, by the bits
    for key in members:
        later.add(key)
    later._recent.clear()
    assert not any(later.add(key) for key in members)
    strangers = sum(f"agent:t{i:05d}" in bloom for i in range(20000))
    # 5,000 members in 65,536 bits with 7 hashes: about 1.4% of strangers answer "maybe"
    assert strangers < 20000 * 0.04
    assert "agent:" not in BloomFilter()


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        BloomFilter(bits=4)
    with pytest.raises(ValueError):
        BloomFilter(hashes=9)


def test_a_filter_goes_over_the_wire_as_plain_data_and_a_bad_one_is_refused():
    bloom = BloomFilter(bits=1 << 12, hashes=5)
    bloom.add("blob:a")
    again = BloomFilter.restore(bloom.state())
    assert "blob:a" in again and "blob:b" not in again and again.state() == bloom.state()
    for bad in (None, {}, {"bits": 1 << 12, "hashes": 5, "array": b"short"},
                {"bits": "4096", "hashes": 5, "array": bytes(512)}, {"bits": 1 << 12, "hashes": 9, "array": bytes(512)}):
        with pytest.raises(ValueError):
            BloomFilter.restore(bad)
