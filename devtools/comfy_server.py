"""A real ComfyUI server on 127.0.0.1 for tests and the demo: free port, its own base directory,
in-memory database, stopped by its own PID. Its waits are hang guards, sized for a machine several times
slower than the two idle cores the runs were measured on."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

from .paths import COMFYUI_DIR, VENV_PYTHON, make_base_directory


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    def __init__(self, base_dir: str, port: int | None = None, log_path: str | None = None,
                 extra_args: tuple[str, ...] = ()):
        self.base_dir = make_base_directory(base_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or os.path.join(base_dir, "comfyui.log")
        self.process: subprocess.Popen | None = None
        self.client_id = uuid.uuid4().hex
        self.extra_args = tuple(extra_args)

    def start(self, timeout: float = 600.0) -> "ComfyServer":
        log = open(self.log_path, "w", encoding="utf-8")
        self.process = subprocess.Popen(
            [VENV_PYTHON, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
             "--base-directory", self.base_dir, "--database-url", "sqlite:///:memory:",
             "--disable-auto-launch", *self.extra_args],
            cwd=COMFYUI_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.process.returncode} while starting:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/object_info/Wan22Schedule", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"ComfyUI did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, encoding="utf-8") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    # --- HTTP API ---
    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=120) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def queue(self, prompt: dict) -> tuple[int, dict]:
        """POST /prompt; (status, response). A 400 carries the validation's node_errors."""
        return self.post("/prompt", {"prompt": prompt, "client_id": self.client_id})

    def wait(self, prompt_id: str, timeout: float = 1200.0) -> dict:
        """The /history entry of a finished prompt."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            history = self.get(f"/history/{prompt_id}")
            if prompt_id in history and history[prompt_id].get("status", {}).get("completed") is not None:
                entry = history[prompt_id]
                if entry["status"].get("status_str") in ("success", "error"):
                    return entry
            if self.process.poll() is not None:
                raise RuntimeError(f"ComfyUI died:\n{self.log_tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"prompt {prompt_id} did not finish within {timeout:.0f} s")

    # --- websocket: progress and interruption, as the frontend sees them ---
    def watch(self, prompt: dict, on_message=None, timeout: float = 1200.0) -> tuple[str, list]:
        """Queues `prompt` and follows its websocket messages to its end. `on_message(message)` may
        return True to POST /interrupt. Returns (prompt_id, messages)."""
        import asyncio

        import aiohttp

        async def go():
            messages = []
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(f"{self.url}/ws?clientId={self.client_id}") as ws:
                    status, body = self.queue(prompt)
                    if status != 200:
                        raise RuntimeError(f"prompt refused: {json.dumps(body)}")
                    prompt_id = body["prompt_id"]
                    async with asyncio.timeout(timeout):
                        async for msg in ws:
                            if msg.type != aiohttp.WSMsgType.TEXT:
                                continue
                            data = json.loads(msg.data)
                            if data.get("data", {}).get("prompt_id") not in (None, prompt_id):
                                continue
                            messages.append(data)
                            if on_message is not None and on_message(data):
                                async with session.post(f"{self.url}/interrupt") as r:
                                    r.raise_for_status()
                            if data["type"] in ("execution_interrupted", "execution_error", "execution_success"):
                                return prompt_id, messages
            raise RuntimeError("the websocket closed before the prompt ended")

        return asyncio.run(go())

    def run_and_interrupt(self, prompt: dict, node_id: str, at_step: int, timeout: float = 1200.0):
        """Queues `prompt` and POSTs /interrupt once node `node_id` reports progress `at_step`."""
        sent = []

        def interrupt_at(message):
            data = message.get("data", {})
            if (not sent and message["type"] == "progress" and data.get("node") == node_id
                    and data.get("value", 0) >= at_step):
                sent.append(True)
                return True
            return False

        return self.watch(prompt, interrupt_at, timeout)


# --- whole prompts, as the tests run them on a server ---
# A hang guard only (pytest's own limit is 3600 s too): the as-shipped 640x640x81 LightX2V video takes about
# 5 minutes on two idle cores, the official template's two 4-step runs and one umt5 encoding a few minutes.
HANG_GUARD_S = 3600


def run_prompt(server: ComfyServer, prompt: dict) -> dict:
    """Queues `prompt`, which must pass validation, and waits for its end: its /history entry."""
    status, body = server.queue(prompt)
    assert status == 200 and body["node_errors"] == {}, body
    return server.wait(body["prompt_id"], timeout=HANG_GUARD_S)


def run_and_load(server: ComfyServer, prompt: dict) -> tuple:
    """Runs `prompt`, which must succeed and save a latent with its one SaveLatent node: (the latent, the
    /history entry). The file is removed, so that the next run under the same prefix is found alone."""
    from safetensors.torch import load_file

    entry = run_prompt(server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    (prefix,) = [node["inputs"]["filename_prefix"] for node in prompt.values() if node["class_type"] == "SaveLatent"]
    (path,) = glob.glob(os.path.join(server.base_dir, "output", f"{prefix}_*.latent"))
    latent = load_file(path)["latent_tensor"]
    os.remove(path)
    return latent, entry
