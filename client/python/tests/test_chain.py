"""Chains (Client.chain): steps feeding each other by tag, run in one RunChain call, and
prepared by the server when run again unchanged."""

import gpucompute
import numpy as np
import pytest


def test_a_chain_run_again_runs_prepared(client):
    host = np.arange(1024, dtype=np.float32)
    x = client.put(host)
    chain = client.chain()
    t = chain.eval("2*x", x=x)
    u = chain.eval("t + 1", t=t)
    last = chain.eval("u - x", u=u, x=x, out=x)
    assert (t.ref, u.ref, len(chain)) == ("tag:#1", "tag:#2", 3)
    first = chain.run()
    assert not first.prepared and first.operation_id == ""
    assert len({op.id for op in first.operations}) == 3
    expected = host * 2 + 1 - host
    np.testing.assert_array_equal(x.get(), expected)
    second = chain.run()
    assert second.prepared and second.operation_id.startswith("op-")
    # Every step's Operation carries the id the answer gave once.
    assert [op.id for op in second.operations] == [second.operation_id] * 3
    assert all(op.stream_id == second.stream_id for op in second.operations)
    assert second.operation(last).outputs[0].id == x.id
    for _ in range(5):
        assert chain.run().prepared
        expected = expected * 2 + 1 - expected
    np.testing.assert_array_equal(x.get(), expected * 2 + 1 - expected)
    # The temporaries stay with the prepared chain, out of the client's listing.
    assert [b.id for b in client.buffers()] == [x.id]


def test_a_chain_that_changes_is_not_prepared_until_run_again(client):
    x = client.put(np.zeros(16))
    chain = client.chain()
    chain.eval("x + 1", x=x, out=x)
    chain.run()
    assert chain.run().prepared
    chain.eval("x * 3", x=x, out=x)
    assert not chain.run().prepared
    assert chain.run().prepared
    np.testing.assert_array_equal(x.get(), np.full(16, 30.0))  # ((2 + 1)*3 + 1)*3


def test_kept_outputs_stay_and_temporaries_go(client):
    x = client.put(np.arange(8.0))
    chain = client.chain()
    t = chain.eval("x + 1", x=x)
    kept = chain.eval("t * t", t=t)
    total = chain.reduce("sum", kept)
    result = chain.run(keep=[kept])
    assert not result.prepared
    squared = result.array(kept)
    np.testing.assert_array_equal(squared.get(), (np.arange(8.0) + 1) ** 2)
    # A reduction's values come inline; its output, a temporary, is not listed.
    assert result.operation(total).values[0].float_value == np.sum((np.arange(8.0) + 1) ** 2)
    assert not result.operation(total).outputs
    assert {b.id for b in client.buffers()} == {x.id, squared.id}
    assert not chain.run(keep=["#2"]).prepared  # a new buffer kept each time
    assert len(client.buffers()) == 3


def test_an_invalid_step_rejects_the_whole_chain(client):
    x = client.put(np.arange(4.0))
    chain = client.chain()
    chain.eval("x + 1", x=x, out=x)
    chain.eval("y + 1", y="no-such-buffer")
    with pytest.raises(gpucompute.NotFoundError) as raised:
        chain.run()
    assert raised.value.details == "step 1 ('#2'): input 'y': no buffer named 'no-such-buffer'"
    np.testing.assert_array_equal(x.get(), np.arange(4.0))  # nothing ran
    assert [b.id for b in client.buffers()] == [x.id]
