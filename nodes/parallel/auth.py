"""Ray's token authentication, checked for the parallel plan's workers: before anything starts (the pool, in
ComfyUI's process), once connected (the driver), and on the cluster's workers (the rendezvous actor). Ray's
servers listen on every interface, so the workers run only behind its token, unless the user opted out
(WITHOUT_AUTH).

The standard library only at the top: the driver and the actor load this file by its path, and Ray sends it to
the workers by value (driver.py), where the pack's module names do not exist.
"""

from __future__ import annotations

import os
import stat

# Set to 1 to run the workers on a Ray cluster without token authentication (anyone who can reach its ports can
# then run code as this user): refused otherwise.
WITHOUT_AUTH = "WAN22_RAY_WITHOUT_AUTH"


class Refused(Exception):
    """Ray runs without the authentication the workers require: ComfyUI names it against `workers`."""


def refusal(why: str) -> Refused:
    return Refused(f"{why}: anyone who can reach the cluster's ports could run code as this user. Leave "
                   "RAY_AUTH_MODE unset or set it to token (Ray >= 2.60; a cluster you join must be started with it "
                   f"too), or set {WITHOUT_AUTH}=1 to run without it on a network you trust")


def without_auth() -> bool:
    return os.environ.get(WITHOUT_AUTH) == "1"


def token_mode() -> str:
    """This process's authentication as Ray reports it: "token", "disabled", or "unknown" (a Ray that predates
    token authentication)."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError:
        return "unknown"
    return "token" if get_authentication_mode() == AuthenticationMode.TOKEN else "disabled"


def check_before_start(ray_version: str, cluster: bool) -> None:
    """Before any process starts: a Ray with token authentication, and no RAY_AUTH_MODE that turns it off."""
    if without_auth():
        return
    if token_mode() == "unknown":
        raise refusal(f"Ray {ray_version} predates token authentication")
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.strip().lower() != "token":
        where = "the Ray cluster at RAY_ADDRESS" if cluster else "the local Ray cluster"
        raise refusal(f"RAY_AUTH_MODE={mode} would run {where} without token authentication")


def check_connected(cluster_mode) -> None:
    """Once connected: this process, and the cluster's workers (`cluster_mode()`: their token_mode, asked of
    the rendezvous actor), run with token authentication."""
    if without_auth():
        return
    if token_mode() != "token":
        raise refusal("the driver connected to Ray without token authentication")
    if cluster_mode() != "token":
        raise refusal("the Ray cluster runs its workers without token authentication")


def private_token() -> None:
    """Ray writes its token to ~/.ray/auth_token readable by everyone: only its owner may read it."""
    path = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    except OSError:
        pass
