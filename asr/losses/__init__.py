"""Losses as pure functions of tensors and a joiner: transducer (sample-wise and batched),
CTC and label-smoothed cross-entropy, sharing one input check and one reduction rule.
Imports no model: the sample-wise loss's fused path uses what a joiner offers through
`tanh_joint_parts`."""
