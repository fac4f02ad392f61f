"""ps mode's packed gradients (tfyarn.train.ps.packing): the ps gets the worker's very gradients."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfyarn.train.ps.packing import pack_gradients  # noqa: E402


def _graph(ids_dtype):
    """Two embeddings (sparse gradients, one from a gather of a read), a Dense kernel and bias."""
    init = tf.random_normal_initializer(seed=3)
    users = tf.Variable(init([50, 4]), name="users")
    items = tf.Variable(init([30, 4]), name="items")
    kernel = tf.Variable(init([8, 3]), name="kernel")
    bias = tf.Variable(tf.zeros([3]), name="bias")
    uid = tf.constant([1, 7, 7, 49, 0], ids_dtype)
    iid = tf.constant([[2, 3], [29, 2], [0, 0], [5, 6], [1, 1]], tf.int64)
    u = tf.gather(tf.convert_to_tensor(users), uid)  # as Keras 3's Embedding
    i = tf.reduce_mean(tf.nn.embedding_lookup(items, iid), 1)
    loss = tf.reduce_sum(tf.square(tf.matmul(tf.concat([u, i], 1), kernel) + bias))
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    return opt, opt.compute_gradients(loss, var_list=[users, items, kernel, bias])


@pytest.mark.parametrize("ids_dtype", [tf.int32, tf.int64])
def test_packed_gradients_equal_the_computed_ones_sparse_and_dense_and_update_the_same(ids_dtype):
    g = tf.Graph()
    with g.as_default():
        opt, gvs = _graph(ids_dtype)
        packed = pack_gradients(gvs, "")
        assert [v for _, v in packed] == [v for _, v in gvs]
        assert [type(p) for p, _ in packed] == [type(q) for q, _ in gvs]
        assert isinstance(packed[0][0], tf.IndexedSlices)
        assert packed[0][0].indices.dtype == ids_dtype
        ops = {op.name.split("/")[0] for op in g.get_operations()}
        assert {"tfyarn_pack_grads", "tfyarn_unpack_grads"} <= ops
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for (a, _), (b, _) in zip(gvs, packed):
                if isinstance(a, tf.IndexedSlices):
                    (av, ai), (bv, bi) = sess.run([(a.values, a.indices), (b.values, b.indices)])
                    np.testing.assert_array_equal(ai, bi)
                    np.testing.assert_array_equal(av, bv)
                else:
                    np.testing.assert_array_equal(*sess.run([a, b]))


def test_a_lone_gradient_per_ps_is_sent_as_it_is():
    g = tf.Graph()
    with g.as_default():
        opt, gvs = _graph(tf.int64)
        single = [gvs[2]]
        assert pack_gradients(single, "") == single  # one gradient: nothing to pack
        with tf.compat.v1.device("/job:ps/task:0"):
            other = tf.Variable(tf.zeros([3]), name="on_another_ps")
        mixed = [gvs[2], (tf.ones([3]), other)]
        assert pack_gradients(mixed, "") == mixed  # one per ps each
