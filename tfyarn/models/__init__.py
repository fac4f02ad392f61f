def binary_logit_metrics(model, labels, logits) -> dict:
    """Batch metrics of a model whose predictions are logits of a 0/1 label: mean loss and accuracy."""
    import tensorflow as tf

    labels = tf.cast(labels, tf.float32)
    correct = tf.cast(tf.equal(tf.cast(logits > 0, tf.float32), labels), tf.float32)
    return {"loss": tf.reduce_mean(model.loss(labels, logits)), "accuracy": tf.reduce_mean(correct)}
