"""Networks: the Conformer encoder, the transducer's predictor and joiner, the attention
decoder, and `build.build_model`, which reads the ``model`` config into typed per-part
configs. Imports neither data nor losses."""
