"""The shipped workflows, as specs the workflow builder turns into UI-format files inside the real
frontend (and into API-format copies with the frontend's own graphToPrompt)."""

from __future__ import annotations

from .paths import import_pack
from .standins import CONTROL_IMAGE, START_IMAGE, TEXT_FOLDER, TI2V_FILE, UMT5, VACE_FILES, VAE, VAE22
from .tiny_wan import LORA_NAMES

import_pack()
from wan22_cachedit.nodes.core.cache import CachePlan  # noqa: E402

REPACKAGED = "https://huggingface.co/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files"
UMT5_URL = ("https://huggingface.co/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files/text_encoders/"
            + UMT5)


def model(name: str, directory: str) -> dict:
    url = UMT5_URL if name == UMT5 else f"{REPACKAGED}/{directory}/{name}"
    return {"name": name, "url": url, "directory": directory}


def node(id, type, pos, widgets=None, links=None, title=None):
    return {"id": id, "type": type, "pos": pos, "widgets": widgets or {}, "links": links or {}, "title": title}


# The template's text-to-video expert files (ComfyUI's repackaged fp8 ones).
T2V_EXPERTS = ("wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors")
# The shipped workflows carry the Cache-DiT node's measured defaults (the error criterion at its target, chosen on
# the tuning bed): what a user runs first is what the pack measured. Workflows saved with other values keep them.
CACHE_DEFAULTS = {"enabled": True, **CachePlan().node_inputs()}
# The demo runs on tiny random stand-ins, whose cache misses are far larger than a trained model's: at the default
# target they cache nothing, so the demo's node asks for a target that lets them cache, and its title says so.
DEMO_TARGET = 0.5
DEMO_CACHE = {**CACHE_DEFAULTS, "error_target": DEMO_TARGET}
DEMO_CACHE_TITLE = f"Cache-DiT (error_target {DEMO_TARGET:g}: random stand-ins only)"
# Wan2.2's own default negative prompt, as ComfyUI's Wan2.2 templates carry it (garish colours, overexposed,
# static, blurry details, subtitles, ... worst quality, low quality, JPEG artefacts, ugly, extra fingers, ...).
NEGATIVE = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，丑陋的，"
            "残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，"
            "三条腿，背景人很多，倒着走，裸露，NSFW")
# The positive prompt of ComfyUI's Wan2.2 14B text-to-video template.
TEMPLATE_PROMPT = ("Beautiful young European woman with honey blonde hair gracefully turning her head back over shoulder, "
                   "gentle smile, bright eyes looking at camera. Hair flowing in slow motion as she turns. Soft natural "
                   "lighting, clean background, cinematic slow-motion portrait.")


def native_text(prompt: str) -> list[dict]:
    return [
        node(1, "CLIPLoader", [20, 40], {"clip_name": UMT5, "type": "wan"}),
        node(2, "CLIPTextEncode", [440, 40], {"text": prompt}, {"clip": (1, 0)}, "Positive Prompt"),
        node(3, "CLIPTextEncode", [440, 300], {"text": NEGATIVE}, {"clip": (1, 0)}, "Negative Prompt"),
    ]


def schedule_widgets(sampler: str, steps: int, shift: float, scheduler: str = "simple") -> dict:
    return {"sampler": sampler, "steps": steps, "flow_shift": shift, "boundary": "auto", "scheduler": scheduler}


def experts_schedule_cache(task: str, high: str, low: str, sampler: str, steps: int, shift: float,
                           cache: dict = CACHE_DEFAULTS) -> list[dict]:
    return [
        node(4, "Wan22ExpertLoader", [20, 260], {"high_noise_model": high, "low_noise_model": low,
                                                 "weight_dtype": "default"}),
        node(5, "Wan22Schedule", [440, 560], schedule_widgets(sampler, steps, shift), {"experts": (4, 0)}),
        node(6, "Wan22CacheDiT", [440, 900], dict(cache), {"experts": (4, 0)}),
    ]


def sampler_and_outputs(latent_from, positive_from, negative_from, cfg, video: bool, prefix: str,
                        experts_from=(6, 0), schedule_from=(5, 0), decode_from=(8, 0), vae_from=None,
                        fps: float = 16.0) -> list[dict]:
    """The sampler, the decode (with its own VAE Loader unless `vae_from` gives one), the timeline, the report
    and the video (at `fps`) or image output."""
    nodes = [
        node(8, "Wan22TwoStageSampler", [880, 380], {"seed": 42, "cfg_high": cfg[0], "cfg_low": cfg[1]},
             {"experts": experts_from, "schedule": schedule_from, "positive": positive_from,
              "negative": negative_from, "latent_image": latent_from}),
        node(10, "VAEDecode", [1320, 40], links={"samples": decode_from, "vae": vae_from or (9, 0)}),
        node(13, "PreviewImage", [1320, 240], links={"images": (8, 2)}, title="Timeline"),
        node(14, "PreviewAny", [1320, 640], links={"source": (8, 1)}, title="Report"),
    ]
    if vae_from is None:
        nodes.insert(1, node(9, "VAELoader", [880, 780], {"vae_name": VAE}))
    if video:
        nodes += [node(11, "CreateVideo", [1760, 40], {"fps": fps}, {"images": (10, 0)}),
                  node(12, "SaveVideo", [1760, 240], {"filename_prefix": prefix, "format": "auto", "codec": "auto"},
                       {"video": (11, 0)})]
    else:
        nodes.append(node(11, "SaveImage", [1760, 40], {"filename_prefix": prefix}, {"images": (10, 0)}))
    return nodes


def t2v() -> dict:
    high, low = T2V_EXPERTS
    nodes = native_text("A red fox trots through fresh snow in a birch forest at sunrise, its breath visible, "
                        "the camera tracking beside it at ground level.")
    nodes += experts_schedule_cache("t2v", high, low, "uni_pc", 40, 12.0)
    nodes.append(node(7, "EmptyHunyuanLatentVideo", [880, 40], {"width": 832, "height": 480, "length": 81,
                                                               "batch_size": 1}))
    nodes += sampler_and_outputs((7, 0), (2, 0), (3, 0), (4.0, 3.0), True, "video/wan22_t2v")
    return {"nodes": nodes, "models": [model(high, "diffusion_models"), model(low, "diffusion_models"),
                                       model(UMT5, "text_encoders"), model(VAE, "vae")]}


def t2v_parallel() -> dict:
    """The text-to-video workflow with the parallel plan between the cache and the sampler: two workers on this
    machine's GPUs (or its CPU), split `auto`: at its CFG 4 / 3 each worker runs one prompt of each evaluation."""
    high, low = T2V_EXPERTS
    nodes = native_text("A red fox trots through fresh snow in a birch forest at sunrise, its breath visible, "
                        "the camera tracking beside it at ground level.")
    nodes += experts_schedule_cache("t2v", high, low, "uni_pc", 40, 12.0)
    nodes.append(node(15, "Wan22ParallelPlan", [20, 760], {"workers": 2, "devices": "auto", "ulysses_degree": 2,
                                                          "cpu_threads": 0, "split": "auto"}, {"experts": (6, 0)}))
    nodes.append(node(7, "EmptyHunyuanLatentVideo", [880, 40], {"width": 832, "height": 480, "length": 81,
                                                               "batch_size": 1}))
    nodes += sampler_and_outputs((7, 0), (2, 0), (3, 0), (4.0, 3.0), True, "video/wan22_t2v_parallel",
                                 experts_from=(15, 0))
    return {"nodes": nodes, "models": [model(high, "diffusion_models"), model(low, "diffusion_models"),
                                       model(UMT5, "text_encoders"), model(VAE, "vae")]}


def low_noise_t2i() -> dict:
    low = T2V_EXPERTS[1]
    nodes = native_text("A lighthouse on a rocky cliff under a stormy sky, waves breaking below, dramatic light, "
                        "highly detailed photograph.")
    nodes += experts_schedule_cache("t2v", "none", low, "uni_pc", 30, 3.0)
    nodes.append(node(7, "EmptyHunyuanLatentVideo", [880, 40], {"width": 1280, "height": 720, "length": 1,
                                                               "batch_size": 1}))
    nodes += sampler_and_outputs((7, 0), (2, 0), (3, 0), (3.5, 3.5), False, "wan22_t2i")
    return {"nodes": nodes, "models": [model(low, "diffusion_models"), model(UMT5, "text_encoders"),
                                       model(VAE, "vae")]}


def i2v() -> dict:
    high, low = "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors", "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors"
    nodes = native_text("The scene comes alive: light shifts slowly across the frame as the camera pushes in.")
    nodes += experts_schedule_cache("i2v", high, low, "uni_pc", 40, 5.0)
    nodes += [
        node(15, "LoadImage", [20, 480], {"image": START_IMAGE}, title="Start Image"),
        node(16, "VAELoader", [20, 900], {"vae_name": VAE}),
        node(7, "WanImageToVideo", [880, 40], {"width": 832, "height": 480, "length": 81, "batch_size": 1},
             {"positive": (2, 0), "negative": (3, 0), "vae": (16, 0), "start_image": (15, 0)}),
    ]
    nodes += sampler_and_outputs((7, 2), (7, 0), (7, 1), (3.5, 3.5), True, "video/wan22_i2v")
    return {"nodes": nodes, "models": [model(high, "diffusion_models"), model(low, "diffusion_models"),
                                       model(UMT5, "text_encoders"), model(VAE, "vae")]}


def vace() -> dict:
    """VACE-Fun A14B with the cache: ComfyUI's WanVaceToVideo (a control image, e.g. a pose or depth frame, held
    over the frames; a reference image) conditions the experts, the sampler's Cache-DiT keeps VACE's hints
    fresh on cached steps, and TrimVideoLatent takes the reference frame off before the decode, as ComfyUI's VACE
    template does. Text-to-video's schedule (VACE-Fun is built on Wan2.2 T2V A14B: boundary 0.875). Its cache is
    the node's defaults, as every shipped workflow's."""
    high, low = VACE_FILES["high"], VACE_FILES["low"]
    nodes = native_text("A red fox trots through fresh snow in a birch forest at sunrise, following the pose of the "
                        "control frames.")
    nodes += experts_schedule_cache("t2v", high, low, "uni_pc", 40, 12.0)
    nodes += [
        node(15, "LoadImage", [20, 480], {"image": START_IMAGE}, title="Reference Image"),
        node(17, "LoadImage", [20, 1200], {"image": CONTROL_IMAGE}, title="Control (pose, depth or track)"),
        node(16, "VAELoader", [20, 900], {"vae_name": VAE}),
        node(7, "WanVaceToVideo", [880, 40], {"width": 832, "height": 480, "length": 81, "batch_size": 1,
                                              "strength": 1.0},
             {"positive": (2, 0), "negative": (3, 0), "vae": (16, 0), "control_video": (17, 0),
              "reference_image": (15, 0)}),
        node(18, "TrimVideoLatent", [1320, 900], links={"samples": (8, 0), "trim_amount": (7, 3)},
             title="Trim the reference frame"),
    ]
    nodes += sampler_and_outputs((7, 2), (7, 0), (7, 1), (4.0, 3.0), True, "video/wan22_vace", decode_from=(18, 0))
    return {"nodes": nodes, "models": [model(high, "diffusion_models"), model(low, "diffusion_models"),
                                       model(UMT5, "text_encoders"), model(VAE, "vae")]}


def ti2v_5b() -> dict:
    """TI2V-5B with the cache, in the official 5B template's shape: one transformer (loaded alone, so the schedule
    has one stage and the sampler's cfg_high is the run's CFG), the Wan2.2 VAE's Wan22ImageToVideoLatent with a
    start image (leave it out for text-to-video), uni_pc/simple 20 steps, shift 8, CFG 5, 1280x704x121 at 24 fps.
    Its cache is the node's defaults, as every shipped workflow's."""
    nodes = native_text("The scene comes alive: light shifts slowly across the frame as the camera pushes in.")
    nodes += [
        node(4, "Wan22ExpertLoader", [20, 260], {"high_noise_model": TI2V_FILE, "low_noise_model": "none",
                                                 "weight_dtype": "default"}, title="Load TI2V-5B (one transformer)"),
        node(5, "Wan22Schedule", [440, 560], schedule_widgets("uni_pc", 20, 8.0), {"experts": (4, 0)}),
        node(6, "Wan22CacheDiT", [440, 900], dict(CACHE_DEFAULTS), {"experts": (4, 0)}),
        node(15, "LoadImage", [20, 480], {"image": START_IMAGE}, title="Start Image"),
        node(9, "VAELoader", [20, 900], {"vae_name": VAE22}, title="Load the Wan2.2 VAE"),
        node(7, "Wan22ImageToVideoLatent", [880, 40], {"width": 1280, "height": 704, "length": 121,
                                                       "batch_size": 1},
             {"vae": (9, 0), "start_image": (15, 0)}),
    ]
    nodes += sampler_and_outputs((7, 0), (2, 0), (3, 0), (5.0, 5.0), True, "video/wan22_ti2v_5b", vae_from=(9, 0),
                                 fps=24.0)
    return {"nodes": nodes, "models": [model(TI2V_FILE, "diffusion_models"), model(UMT5, "text_encoders"),
                                       model(VAE22, "vae")]}


def template_loaders(high: str, low: str) -> list[dict]:
    """The template's two Load Diffusion Model nodes."""
    return [
        node(18, "UNETLoader", [20, 560], {"unet_name": high, "weight_dtype": "default"}, title="High-noise expert"),
        node(19, "UNETLoader", [20, 720], {"unet_name": low, "weight_dtype": "default"}, title="Low-noise expert"),
    ]


def lightx2v_experts(high: str, low: str) -> list[dict]:
    """The template's Load Diffusion Model and LightX2V LoraLoaderModelOnly nodes (same files, strength 1)."""
    return template_loaders(high, low) + [
        node(20, "LoraLoaderModelOnly", [440, 560], {"lora_name": LORA_NAMES["high"], "strength_model": 1.0},
             {"model": (18, 0)}, "LightX2V 4-step LoRA (high noise)"),
        node(21, "LoraLoaderModelOnly", [440, 720], {"lora_name": LORA_NAMES["low"], "strength_model": 1.0},
             {"model": (19, 0)}, "LightX2V 4-step LoRA (low noise)"),
    ]


def t2v_lightx2v_4steps() -> dict:
    """ComfyUI's own Wan2.2 14B T2V template with its 4-step LightX2V LoRAs: its own Load Diffusion Model and
    LoraLoaderModelOnly nodes (same files, strength 1), then our bridge, schedule (euler/simple, 4 steps,
    shift 5) and sampler (CFG 1) instead of its two KSamplerAdvanced: the switch is derived from the
    boundary (2 / 2) instead of typed. No Cache-DiT node: with its default warm-ups it can skip none of
    2 + 2 steps."""
    high, low = T2V_EXPERTS
    nodes = native_text(TEMPLATE_PROMPT)
    nodes += lightx2v_experts(high, low)
    nodes += [
        node(4, "Wan22ExpertsFromModel", [440, 880], links={"high_noise_model": (20, 0), "low_noise_model": (21, 0)}),
        node(5, "Wan22Schedule", [440, 1000], schedule_widgets("euler", 4, 5.0), {"experts": (4, 0)}),
        node(7, "EmptyHunyuanLatentVideo", [880, 40], {"width": 640, "height": 640, "length": 81, "batch_size": 1}),
    ]
    nodes += sampler_and_outputs((7, 0), (2, 0), (3, 0), (1.0, 1.0), True, "video/wan22_t2v_lightx2v",
                                 experts_from=(4, 0))
    return {"nodes": nodes, "models": [model(high, "diffusion_models"), model(low, "diffusion_models"),
                                       model(LORA_NAMES["high"], "loras"), model(LORA_NAMES["low"], "loras"),
                                       model(UMT5, "text_encoders"), model(VAE, "vae")]}


def t2v_lightx2v_3stage() -> dict:
    """The three-stage LightX2V recipe: the high-noise expert without the LoRAs at CFG 3.5 for the first 3 of
    24 finer steps (the lead), then the high-noise expert with them at CFG 1 from step 1 of 8 to the switch the
    boundary gives, then the low-noise expert with them at CFG 1. The lead stage node derives both switch
    points from the sigmas (euler/simple, shift 5: step 3 of 24 is step 1 of 8)."""
    high, low = T2V_EXPERTS
    nodes = native_text(TEMPLATE_PROMPT)
    nodes += lightx2v_experts(high, low)
    nodes += [
        node(22, "Wan22ExpertsFromModel", [440, 880], links={"high_noise_model": (18, 0), "low_noise_model": (19, 0)},
             title="Experts without the LoRAs (lead)"),
        node(4, "Wan22ExpertsFromModel", [440, 1000], links={"high_noise_model": (20, 0), "low_noise_model": (21, 0)},
             title="Experts with the LoRAs"),
        node(5, "Wan22Schedule", [440, 1120], schedule_widgets("euler", 8, 5.0), {"experts": (4, 0)}),
        node(23, "Wan22LeadStage", [880, 1040], {"lead_steps": 24, "start_step": 1, "cfg": 3.5},
             {"schedule": (5, 0), "experts": (22, 0)}),
        node(7, "EmptyHunyuanLatentVideo", [880, 40], {"width": 640, "height": 640, "length": 81, "batch_size": 1}),
    ]
    nodes += sampler_and_outputs((7, 0), (2, 0), (3, 0), (1.0, 1.0), True, "video/wan22_t2v_lightx2v_3stage",
                                 experts_from=(4, 0), schedule_from=(23, 0))
    return {"nodes": nodes, "models": [model(high, "diffusion_models"), model(low, "diffusion_models"),
                                       model(LORA_NAMES["high"], "loras"), model(LORA_NAMES["low"], "loras"),
                                       model(UMT5, "text_encoders"), model(VAE, "vae")]}


def t2v_template_cachedit_model() -> dict:
    """ComfyUI's own Wan2.2 14B T2V template as it ships (20 steps, shift 5, CFG 3.5, euler/simple, the switch
    typed at step 10, its two KSamplerAdvanced), with one Wan2.2 Cache-DiT (MODEL) node on each expert
    between its Load Diffusion Model and its ModelSamplingSD3: each KSamplerAdvanced's call gets a context
    of its own for its 10 evaluations. Warm-ups and caps are the Two-Stage Sampler's per expert."""
    high, low = T2V_EXPERTS
    plan = CachePlan().node_inputs()

    def cache(role: str) -> dict:
        shared = {k: plan[k] for k in ("residual_diff_threshold", "first_compute_blocks", "last_compute_blocks",
                                       "max_continuous_cached_steps")}
        return {"enabled": True, **shared, "warmup_steps": plan[f"{role}_warmup_steps"],
                "max_cached_steps": plan[f"{role}_max_cached_steps"], "calibrator": plan["calibrator"],
                "criterion": plan["criterion"], "error_target": plan["error_target"]}

    common = {"steps": 20, "cfg": 3.5, "sampler_name": "euler", "scheduler": "simple"}
    nodes = native_text(TEMPLATE_PROMPT)
    nodes += template_loaders(high, low) + [
        node(24, "Wan22CacheDiTModel", [440, 560], cache("high"), {"model": (18, 0)}, "Cache-DiT (high noise)"),
        node(25, "Wan22CacheDiTModel", [440, 900], cache("low"), {"model": (19, 0)}, "Cache-DiT (low noise)"),
        node(26, "ModelSamplingSD3", [880, 560], {"shift": 5.0}, {"model": (24, 0)}),
        node(27, "ModelSamplingSD3", [880, 720], {"shift": 5.0}, {"model": (25, 0)}),
        node(7, "EmptyHunyuanLatentVideo", [880, 40], {"width": 640, "height": 640, "length": 81, "batch_size": 1}),
        node(28, "KSamplerAdvanced", [1320, 40],
             {"add_noise": "enable", "noise_seed": 42, "control_after_generate": "fixed", **common,
              "start_at_step": 0, "end_at_step": 10, "return_with_leftover_noise": "enable"},
             {"model": (26, 0), "positive": (2, 0), "negative": (3, 0), "latent_image": (7, 0)}),
        node(29, "KSamplerAdvanced", [1320, 560],
             {"add_noise": "disable", "noise_seed": 0, "control_after_generate": "fixed", **common,
              "start_at_step": 10, "end_at_step": 10000, "return_with_leftover_noise": "disable"},
             {"model": (27, 0), "positive": (2, 0), "negative": (3, 0), "latent_image": (28, 0)}),
        node(9, "VAELoader", [1760, 560], {"vae_name": VAE}),
        node(10, "VAEDecode", [1760, 40], links={"samples": (29, 0), "vae": (9, 0)}),
        node(11, "CreateVideo", [2200, 40], {"fps": 16.0}, {"images": (10, 0)}),
        node(12, "SaveVideo", [2200, 240], {"filename_prefix": "video/wan22_template_cachedit", "format": "auto",
                                            "codec": "auto"}, {"video": (11, 0)}),
    ]
    return {"nodes": nodes, "models": [model(high, "diffusion_models"), model(low, "diffusion_models"),
                                       model(UMT5, "text_encoders"), model(VAE, "vae")]}


def tiny_demo() -> dict:
    """What `make demo` runs: every file is a tiny random stand-in the demo writes itself."""
    nodes = [
        node(4, "Wan22ExpertLoader", [20, 40], {"high_noise_model": "wan2.2_t2v_high_noise_14B_fp16.safetensors",
                                                "low_noise_model": "wan2.2_t2v_low_noise_14B_fp16.safetensors",
                                                "weight_dtype": "default"}),
        node(5, "Wan22Schedule", [20, 300], schedule_widgets("uni_pc", 20, 12.0), {"experts": (4, 0)}),
        node(6, "Wan22CacheDiT", [20, 660], dict(DEMO_CACHE), {"experts": (4, 0)}, DEMO_CACHE_TITLE),
        node(3, "Wan22TextEncode", [440, 40], {"model_folder": TEXT_FOLDER,
                                               "prompt": "a red cat walks in the rain in the city at night, camera pans",
                                               "negative_prompt": "blurry low quality static overexposed text watermark"}),
        node(7, "EmptyHunyuanLatentVideo", [440, 420], {"width": 128, "height": 128, "length": 17,
                                                        "batch_size": 1}),
        node(8, "Wan22TwoStageSampler", [880, 40], {"seed": 42, "cfg_high": 4.0, "cfg_low": 3.0},
             {"experts": (6, 0), "schedule": (5, 0), "positive": (3, 0), "negative": (3, 1),
              "latent_image": (7, 0)}),
        node(9, "VAELoader", [880, 440], {"vae_name": VAE}),
        node(10, "VAEDecode", [1320, 40], links={"samples": (8, 0), "vae": (9, 0)}),
        node(11, "SaveAnimatedWEBP", [1760, 40], {"filename_prefix": "wan22_demo/video", "fps": 16.0,
                                                 "lossless": False, "quality": 85, "method": "default"},
             {"images": (10, 0)}, "Save Video (WEBP)"),
        node(13, "SaveImage", [1320, 240], {"filename_prefix": "wan22_demo/timeline"}, {"images": (8, 2)},
             "Save Timeline"),
        node(14, "PreviewAny", [1320, 640], links={"source": (8, 1)}, title="Report"),
    ]
    return {"nodes": nodes, "models": []}


WORKFLOWS = {
    "wan22_t2v_a14b_cachedit": t2v,
    "wan22_low_noise_t2i": low_noise_t2i,
    "wan22_i2v_a14b_cachedit": i2v,
    "wan22_t2v_a14b_lightx2v_4steps": t2v_lightx2v_4steps,
    "wan22_t2v_a14b_lightx2v_3stage": t2v_lightx2v_3stage,
    "wan22_t2v_a14b_template_cachedit_model": t2v_template_cachedit_model,
    "wan22_tiny_demo": tiny_demo,
    "wan22_t2v_a14b_parallel": t2v_parallel,
    "wan22_vace_a14b_cachedit": vace,
    "wan22_ti2v_5b_cachedit": ti2v_5b,
}
