"""Classifier weights from class names through CLIP's text tower (open_clip), as PEL/LIFT
initialise the cosine head: ``t_c = normalize(mean over templates of normalize(text(template(c))))``
mapped back to the image tower's width by the visual projection, ``w_c = normalize(t_c · Pᵀ)``, so
that ⟨x, w_c⟩ ∝ ⟨x·P, t_c⟩: zero-shot CLIP up to the feature norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from topklab.utils.errors import DataUnavailableError


class TextHead:
    """Cosine-classifier weights (C, D) from the class names.

    Parameters
    ----------
    clip_model : open_clip model name whose text tower (and visual projection) to use, e.g. ViT-B-16-quickgelu
        (OpenAI's weights were trained with QuickGELU; plain ViT-B-16 builds GELU)
    pretrained : open_clip weights tag (openai), or null for a random tower (tests)
    templates : prompt templates with one ``{}`` (PEL/LIFT's default: "a photo of a {}.")
    cache_dir : open_clip's download cache (null: its default)

    Examples
    --------
    >>> weights = TextHead("ViT-B-16", pretrained=None)(["dog", "cat"], out_features=768)
    >>> weights.shape, bool(torch.allclose(weights.norm(dim=1), torch.ones(2)))
    (torch.Size([2, 768]), True)
    """

    def __init__(
        self,
        clip_model: str = "ViT-B-16-quickgelu",
        pretrained: str | None = "openai",
        templates=("a photo of a {}.",),
        cache_dir: str | None = None,
    ):
        if not templates or any("{}" not in t for t in templates):
            raise ValueError("model.head_init.templates must be a non-empty list of strings with one '{}'")
        self.clip_model, self.pretrained, self.templates, self.cache_dir = (
            clip_model,
            pretrained,
            list(templates),
            cache_dir,
        )

    def _clip(self):
        import logging

        import open_clip

        try:
            logging.getLogger().setLevel(
                max(logging.getLogger().level, logging.ERROR)
            )  # "no pretrained weights" is expected in tests
            model = open_clip.create_model(
                self.clip_model,
                pretrained=self.pretrained,
                cache_dir=self.cache_dir,
                require_pretrained=self.pretrained is not None,
            )
        except RuntimeError as err:
            if "Model config for" in str(err) or "not found" in str(err).lower() and "weights" not in str(err).lower():
                raise ValueError(f"model.head_init.clip_model={self.clip_model!r} is not an open_clip model") from None
            raise DataUnavailableError(self._missing(err)) from None
        except (OSError, ValueError) as err:
            raise DataUnavailableError(self._missing(err)) from None
        return model.eval(), open_clip.get_tokenizer(self.clip_model)

    def _missing(self, err: Exception) -> str:
        where = self.cache_dir or "open_clip's cache (~/.cache/huggingface/hub or ~/.cache/clip)"
        return (
            f"CLIP weights {self.clip_model}/{self.pretrained} for the text head are not in {where} "
            f"({type(err).__name__}); fetch them where a network exists (open_clip.create_model('{self.clip_model}', "
            f"pretrained='{self.pretrained}')) and copy the cache here, or set model.head_init=null"
        )

    @torch.no_grad()
    def __call__(self, class_names: list[str], out_features: int) -> torch.Tensor:
        model, tokenizer = self._clip()
        per_class = []
        for name in class_names:
            text = F.normalize(model.encode_text(tokenizer([t.format(name) for t in self.templates])), dim=-1)
            per_class.append(text.mean(0))
        text = F.normalize(torch.stack(per_class), dim=-1)
        projection = model.visual.proj
        if projection is None or projection.shape[0] != out_features:
            raise ValueError(
                f"{self.clip_model}'s visual projection maps {None if projection is None else projection.shape[0]} "
                f"features, the backbone gives {out_features}; pair the text head with its CLIP image tower"
            )
        return F.normalize(text @ projection.T, dim=-1)
