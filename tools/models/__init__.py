"""PyTorch model factories that `tools build-repo` exports, one module per model.

The spec (``repository.yaml``) names three callables of a model module by import path
(``package.module:function``); ``tools/build_repo/spec/references.py`` resolves them. Every model module follows
the same contract, so the builder treats MiniLM and EfficientNet-Lite0 alike:

``build_model() -> torch.nn.Module``
    (spec key ``source``) Returns the model in ``eval()`` mode on the CPU, with real weights,
    loaded offline (no hub access). Its ``forward`` takes the spec's inputs as positional
    arguments **in the order the spec lists them** and returns one tensor (one output) or a tuple
    of tensors in the order the spec lists the outputs. Everything the server should not do in
    Python (pooling, normalisation) happens inside ``forward`` so it is in the exported graph.

``sample_inputs(batch_size: int, axes: Mapping[str, int]) -> dict[str, torch.Tensor]``
    (spec key ``sample_inputs``) Returns representative inputs, keyed by the spec's input names,
    with leading dimension ``batch_size``. ``axes`` maps every named dynamic axis of the inputs
    other than ``batch`` to the size wanted, e.g. ``{"sequence": 32}`` for MiniLM; it is empty for
    a model whose non-batch dims are all fixed (EfficientNet-Lite0: ``[batch, 3, 224, 224]``).
    Dtypes are the spec's (``int64`` ids, ``float32`` pixels). Deterministic: the same arguments
    give the same tensors. Use real data where it exists (tokenised sentences, real photos) so
    parity is checked on realistic values.

``weights_files() -> list[pathlib.Path]``
    (spec key ``weights``, optional) The files the weights come from; their sha256 goes into
    ``build_manifest.json`` and a change of them triggers a rebuild.
"""
