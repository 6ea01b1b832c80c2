"""API-format prompts around the sampler: native latent, VAE and save nodes, our loader/schedule/sampler."""

from .prompts import loader, schedule

TINY_VAE = "wan_2.1_vae.safetensors"


def t2v_prompt(high, low, folder, *, sampler="unipc", steps=8, flow_shift=12.0, seed=0, cfg_high=4.0, cfg_low=3.0,
               width=64, height=64, length=5, batch=1, boundary="auto", boundary_ratio=0.875, decode=True,
               save_latent_prefix=None, prompt_text="a cat walks in the rain", negative_text="blurry",
               cache=None, lora=None):
    """`cache`: None for no Cache-DiT node, or a dict of Wan22CacheDiT inputs (over the defaults).
    `lora`: None for no LoRA node, or a dict of Wan22LoraLoader inputs (between loader and cache node)."""
    p = {
        "1": loader(high, low),
        "2": schedule("1", sampler=sampler, steps=steps, flow_shift=flow_shift, boundary=boundary,
                      boundary_ratio=boundary_ratio),
        "3": {"class_type": "Wan22TextEncode",
              "inputs": {"model_folder": folder, "prompt": prompt_text, "negative_prompt": negative_text}},
        "4": {"class_type": "EmptyHunyuanLatentVideo",
              "inputs": {"width": width, "height": height, "length": length, "batch_size": batch}},
        "5": {"class_type": "Wan22TwoStageSampler",
              "inputs": {"experts": ["1", 0], "schedule": ["2", 0], "positive": ["3", 0], "negative": ["3", 1],
                         "latent_image": ["4", 0], "seed": seed, "cfg_high": cfg_high, "cfg_low": cfg_low}},
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["5", 1]}},
    }
    if lora is not None:
        p["40"] = lora_node("1", **lora)
        p["5"]["inputs"]["experts"] = ["40", 0]
    if cache is not None:
        p["20"] = cache_node("40" if lora is not None else "1", **cache)
        p["5"]["inputs"]["experts"] = ["20", 0]
    if decode:
        p["7"] = {"class_type": "VAELoader", "inputs": {"vae_name": TINY_VAE}}
        p["8"] = {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["7", 0]}}
        p["9"] = {"class_type": "SaveAnimatedWEBP",
                  "inputs": {"images": ["8", 0], "filename_prefix": "wan22_test", "fps": 16.0, "lossless": False,
                             "quality": 80, "method": "default"}}
        p["10"] = {"class_type": "SaveImage", "inputs": {"images": ["5", 2], "filename_prefix": "wan22_timeline"}}
    if save_latent_prefix:
        p["11"] = {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": save_latent_prefix}}
    return p


CACHE_DEFAULTS = {"enabled": True, "residual_diff_threshold": 0.24, "first_compute_blocks": 1, "last_compute_blocks": 0,
                  "max_continuous_cached_steps": 3, "high_warmup_steps": 4, "high_max_cached_steps": -1,
                  "low_warmup_steps": 2, "low_max_cached_steps": 20}


def cache_node(experts_from="1", **overrides):
    return {"class_type": "Wan22CacheDiT", "inputs": {"experts": [experts_from, 0], **CACHE_DEFAULTS, **overrides}}


def lora_node(experts_from="1", high="none", low="none", high_strength=1.0, low_strength=1.0):
    return {"class_type": "Wan22LoraLoader",
            "inputs": {"experts": [experts_from, 0], "high_noise_lora": high, "high_noise_strength": high_strength,
                       "low_noise_lora": low, "low_noise_strength": low_strength}}
