"""The vLLM plugin: ``--load-format shardsrv`` streams each rank's weights from shardsrv.

    vllm serve DIR --load-format shardsrv \\
        --model-loader-extra-config '{"url": "http://shardsrv:8080", "checkpoint": "NAME", "token_file": "/var/run/token"}'

DIR needs only config.json and the tokenizer (``shardsrv fetch --small-files``). vLLM finds the
plugin through the ``vllm.general_plugins`` entry point (pyproject.toml) and calls ``register``,
which registers a ``BaseModelLoader`` subclass under the load format ``shardsrv`` with
``register_model_loader``. vLLM's own ``load_model`` builds the model on its device, calls this
loader's ``load_weights(model, model_config)``, then runs ``process_weights_after_loading`` as it
always does. The loader API followed is vLLM's since ``register_model_loader`` arrived (v0.10):
``BaseModelLoader(load_config)`` with ``download_model(model_config)`` and ``load_weights(model,
model_config)``. Only the imports and the two methods touch vLLM; everything else is
shardsrv.loader, tested without it.
"""

import logging

__all__ = ["LOAD_FORMAT", "loader_class", "parse_extra_config", "register"]

log = logging.getLogger("shardsrv")

LOAD_FORMAT = "shardsrv"
_KEYS = ("url", "checkpoint", "token_file")


def parse_extra_config(extra):
    """--model-loader-extra-config's fields: (url, checkpoint, token or None). Raises ValueError
    naming a missing or unknown field."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(_KEYS))
    if unknown:
        raise ValueError(f"shardsrv: --model-loader-extra-config has unknown fields {unknown}; it takes {list(_KEYS)}")
    for key in ("url", "checkpoint"):
        if not isinstance(extra.get(key), str) or not extra[key]:
            raise ValueError(f'shardsrv: --model-loader-extra-config needs "{key}" '
                             '(e.g. {"url": "http://shardsrv:8080", "checkpoint": "NAME"})')
    token = None
    if extra.get("token_file"):
        with open(extra["token_file"]) as f:
            token = f.read().strip()
    return extra["url"], extra["checkpoint"], token


def loader_class(base):
    """The loader, a subclass of vLLM's BaseModelLoader (base)."""

    class ShardsrvModelLoader(base):
        """Loads a model's weights from shardsrv (shardsrv.loader.load_model_weights)."""

        def __init__(self, load_config):
            super().__init__(load_config)
            self.url, self.checkpoint, token = parse_extra_config(load_config.model_loader_extra_config)
            from . import Client
            self.client = Client(self.url, token=token)

        def download_model(self, model_config):
            # Nothing to download: the weights stream at load time. Checks the server has them.
            self.client.tensors(self.checkpoint)

        def load_weights(self, model, model_config):
            from .loader import load_model_weights
            report = load_model_weights(model, self.client, self.checkpoint)
            log.info("shardsrv: loaded %s from %s: %s", self.checkpoint, self.url, report)

    return ShardsrvModelLoader


def register():
    """The vllm.general_plugins entry point."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    register_model_loader(LOAD_FORMAT)(loader_class(BaseModelLoader))
