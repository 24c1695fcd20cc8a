

def test_memory_profile_of_a_stateful_op_keeps_its_state():
    import numpy as np

    import neuroflow as nf
    from neuroflow import ops

    rnn = ops.Elman(1, 8, stateful=True)
    model = nf.Sequential(rnn, ops.Linear(8, 1))
    model.forward(np.ones((4, 5, 1), np.float32))
    before = np.array(rnn.state, copy=True)
    report = nf.memory.profile(model, (2, 5, 1), loss=nf.losses.MSE())
    assert report.predicted_peak_bytes > 0
    np.testing.assert_array_equal(rnn.state, before)
