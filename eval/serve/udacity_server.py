"""Drive the Udacity simulator with a trained controller: its Socket.IO protocol, handlers apart from the transport.

The simulator is the Socket.IO *client*; this module is the server it connects to (port 4567).
On connect the server sends ``steer`` {"steering_angle": "0", "throttle": "0"}. Every
``telemetry`` event carries ``steering_angle``, ``throttle``, ``speed`` (numbers as strings) and
``image`` (base64 JPEG of the 320×160 centre camera); the server answers ``steer`` with string
fields. Empty telemetry means the simulator is in manual mode: the answer is ``manual`` {}.

:class:`TelemetryHandler` is the whole protocol as a pure mapping telemetry dict → :class:`Reply`
(event, payload, log row), so it is tested without a socket. :func:`serve` only wires it to
python-socketio 4.6.1 / python-engineio 3.13.2 on eventlet — the one stack the old Unity
simulator can talk to (it says EIO=4 but behaves like Engine.IO v3 and never sends the namespace
CONNECT "40"; python-socketio 5.x drops its telemetry silently). eventlet and socketio are
imported only inside :func:`serve`, and nothing is monkey-patched, so importing this module (or
nsacdrive) elsewhere is unaffected.

Actions: controllers predict (steer, gas, brake) in the action box. ``steering_angle`` is the
predictive mean steer (the simulator's steering is normalised to [−1, 1] too). ``throttle`` is,
with ``throttle="law"`` (default), the classic drive.py law 1 − steer² − (speed/limit)² (see
:class:`ThrottleLaw`), or with ``throttle="model"`` the controller's own gas − brake (negative
throttle brakes in the simulator). Both are clipped to [−1, 1].

Frames: a Udacity-kind run (``ModelConfig.observation == "udacity"``) gets the RGB camera image
as it is, (160, 320, 3), and preprocesses it as in training (:mod:`nsacdrive.envs.observation_kinds`). A
CarRacing-kind run (the default, also for runs saved before the ``observation`` field existed)
gets the whole camera image resized with ``cv2.INTER_AREA`` to its raw 96×96 frame (aspect 2:1 squashed to 1:1; its preprocessing then crops the bottom 12 rows as it
does the HUD). That lets any run be plugged in, but a CarRacing controller has never seen such
pictures: expect the protocol to work, not the car to drive well.

Malformed telemetry (a missing or non-numeric field, broken base64, not a JPEG, a wrong image
size) and failed or non-finite predictions get the safe reply steering "0", throttle "0", and the
reason goes into the log row; the server never stops on them.

Bounds. An image's base64 text may have at most :data:`MAX_IMAGE_CHARS` characters (checked
before decoding it), and the JPEG must declare exactly 320×160 pixels in its start-of-frame header
before cv2 decodes it, so a small message claiming a huge picture costs nothing. Requests that
carry an ``Origin`` header — every browser's do, the simulator's never — are refused unless the
origin is the server's own address given as an IP or ``localhost``, or one passed as ``origins``
to :func:`serve`: a web page the user visits cannot drive the car or read the predictions.
"""

from __future__ import annotations

import base64
import binascii
import csv
import ipaddress
import json
import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import cv2
import numpy as np

from nsacdrive.common.extras import MissingExtra
from nsacdrive.controllers.actions import ACTION_NAMES, cautious_pedals
from nsacdrive.controllers.prediction import UncertainPrediction
from nsacdrive.data_collection.udacity_layout import FRAME_SIZE, MAX_FRAME_BYTES, declared_frame_size
from nsacdrive.envs.observation import RAW_FRAME_SHAPE
from nsacdrive.envs.observation_kinds import observation_kind
from nsacdrive.envs.udacity_observation import UDACITY_RAW_FRAME_SHAPE, encode_jpeg
from nsacdrive.eval.configs import gas_caution_fits
from nsacdrive.eval.modes import THROTTLE_MODES

logger = logging.getLogger(__name__)

#: (H, W, C) of the simulator's centre camera image, RGB: the raw frame of Udacity-kind runs.
CAMERA_SHAPE = UDACITY_RAW_FRAME_SHAPE
SAFE_REPLY = {"steering_angle": "0", "throttle": "0"}
#: Most base64 characters of a telemetry image: the encoding of MAX_FRAME_BYTES bytes.
MAX_IMAGE_CHARS = 4 * -(-MAX_FRAME_BYTES // 3)
MAX_MESSAGE_BYTES = MAX_IMAGE_CHARS + 4096  # a polling request: the image and a few short fields
TELEMETRY_FIELDS = ("steering_angle", "throttle", "speed", "image")
#: Columns of the per-frame log, in order (uncertainties are variances in action units²).
LOG_FIELDS = ("frame", "time", "status", "reason", "speed", "sim_steering_angle", "sim_throttle",
              "steering_angle", "throttle",
              *(f"{moment}_{name}" for moment in ("mean", "aleatoric", "epistemic") for name in ACTION_NAMES),
              "latency_ms")


class TelemetryError(ValueError):
    """A telemetry message the server cannot act on; the message is the logged reason."""


class Predictor(Protocol):
    """What the handler needs of a controller (:class:`nsacdrive.eval.driver.ControllerAgent` is one)."""

    def reset(self) -> None: ...

    def predict(self, observation: np.ndarray, speed: float | None = None) -> UncertainPrediction: ...


@dataclass(frozen=True)
class ServeConfig:
    """How predictions become simulator commands.

    ``throttle``: ``law`` (1 − steer² − (speed/limit)², the classic script) or ``model`` (gas − brake).
    ``speed_limit`` / ``slow_limit``: the law's limit, and the one it drops to while over it.
    ``pedal_caution``: with ``model``, the pedals' cautious ends, gas − k·σ_gas and brake + k·σ_brake
    (:func:`nsacdrive.controllers.actions.cautious_pedals`); None: their means. ``gas_caution``: the
    gas's own k (0: the brake alone moves); None: ``pedal_caution`` for both.
    """

    throttle: str = "law"
    speed_limit: float = 25.0
    slow_limit: float = 10.0
    pedal_caution: float | None = None
    gas_caution: float | None = None

    def __post_init__(self) -> None:
        if self.throttle not in THROTTLE_MODES:
            raise ValueError(f"--throttle: expected one of {', '.join(THROTTLE_MODES)}, got {self.throttle!r}")
        if not 0 < self.slow_limit <= self.speed_limit:
            raise ValueError(f"speed limits: expected 0 < slow limit ({self.slow_limit}) <= speed limit ({self.speed_limit})")
        if self.pedal_caution is not None and (self.throttle != "model" or not self.pedal_caution >= 0):
            raise ValueError(f"--pedal-caution: expected a number >= 0 with --throttle model, got {self.pedal_caution} "
                             f"with --throttle {self.throttle}")
        if not gas_caution_fits(self.pedal_caution, self.gas_caution):
            raise ValueError(f"--gas-caution: expected a number >= 0 with --pedal-caution, got {self.gas_caution} "
                             f"with --pedal-caution {self.pedal_caution}")


class ThrottleLaw:
    """The classic Udacity drive.py throttle: 1 − steer² − (speed/limit)², clipped to [−1, 1].

    ``limit`` starts at ``speed_limit``; a frame faster than the current limit sets it to
    ``slow_limit``, any other frame back to ``speed_limit`` — so once over 25 the car brakes
    until it is down to 10 (the script's hysteresis, kept as it was). Reset per connection.
    """

    def __init__(self, speed_limit: float = 25.0, slow_limit: float = 10.0) -> None:
        self.speed_limit, self.slow_limit = speed_limit, slow_limit
        self.limit = speed_limit

    def reset(self) -> None:
        self.limit = self.speed_limit

    def __call__(self, steer: float, speed: float) -> float:
        self.limit = self.slow_limit if speed > self.limit else self.speed_limit
        return float(np.clip(1.0 - steer**2 - (speed / self.limit) ** 2, -1.0, 1.0))


def decode_camera_image(text: Any) -> np.ndarray:
    """Base64 JPEG of the centre camera → RGB uint8 (160, 320, 3); :class:`TelemetryError` otherwise."""
    if not isinstance(text, str):
        raise TelemetryError(f"image: expected a base64 string, got {type(text).__name__}")
    if len(text) > MAX_IMAGE_CHARS:
        raise TelemetryError(f"image: {len(text)} base64 characters, expected at most {MAX_IMAGE_CHARS} (a 320×160 JPEG)")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise TelemetryError("image: not valid base64") from None
    if not raw.startswith(b"\xff\xd8\xff"):
        raise TelemetryError("image: not a JPEG (no start-of-image marker)")
    size = declared_frame_size(raw)
    if size is None:
        raise TelemetryError("image: JPEG declares no size (no start-of-frame header before its data)")
    if size != FRAME_SIZE:
        raise TelemetryError(f"image: expected {FRAME_SIZE[0]}×{FRAME_SIZE[1]} pixels, got {size[0]}×{size[1]} (declared, not decoded)")
    bgr = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise TelemetryError("image: JPEG could not be decoded")
    if bgr.shape != CAMERA_SHAPE:
        raise TelemetryError(f"image: expected {CAMERA_SHAPE[1]}×{CAMERA_SHAPE[0]} pixels, got {bgr.shape[1]}×{bgr.shape[0]}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def encode_camera_image(rgb: np.ndarray) -> str:
    """RGB uint8 image → base64 JPEG string, as the simulator sends it (for clients and tests)."""
    return base64.b64encode(encode_jpeg(rgb)).decode("ascii")


def telemetry_number(data: dict[str, Any], name: str) -> float:
    """A finite number from a present telemetry field (the simulator sends numbers as strings)."""
    try:
        value = float(data[name])
    except (TypeError, ValueError):
        raise TelemetryError(f"{name}: not a number ({str(data[name])[:40]!r})") from None
    if not math.isfinite(value):
        raise TelemetryError(f"{name}: not finite ({value})")
    return value


def camera_to_frame(image: np.ndarray, frame_shape: tuple[int, int, int]) -> np.ndarray:
    """The camera image at a run's raw frame size: as is when it matches, else area-resized."""
    if image.shape == frame_shape:
        return image
    return cv2.resize(image, (frame_shape[1], frame_shape[0]), interpolation=cv2.INTER_AREA)


@dataclass(frozen=True)
class Reply:
    """What the server sends for one telemetry message, and the log row that records it."""

    event: str
    data: dict[str, str]
    row: dict[str, Any]

    @property
    def reason(self) -> str:
        return self.row["reason"]


class TelemetryHandler:
    """The Udacity protocol as a pure mapping: connect → first ``steer``, telemetry → :class:`Reply`.

    Keeps one controller's frame history, so it serves one simulator at a time: each connect
    (and each switch to manual mode, after which frames are no longer consecutive) starts it afresh.
    """

    def __init__(self, agent: Predictor, frame_shape: tuple[int, int, int] = RAW_FRAME_SHAPE, speed_input: bool = False,
                 config: ServeConfig | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.agent, self.frame_shape, self.speed_input = agent, frame_shape, speed_input
        self.config = config or ServeConfig()
        self.law = ThrottleLaw(self.config.speed_limit, self.config.slow_limit)
        self.clock = clock
        self.frame = 0

    @classmethod
    def from_run(cls, run_dir: str | Path, config: ServeConfig | None = None, samples: int | None = None,
                 raw: bool = False) -> TelemetryHandler:
        """A handler driving with a trained run folder (loaded by :class:`nsacdrive.eval.driver.ControllerAgent`).

        Inference runs on one thread: a batch-1 prediction gains nothing from more, and spinning
        OpenMP threads on a busy machine turn milliseconds into a second per frame."""
        from nsacdrive.common.workers import single_threaded_worker
        from nsacdrive.eval.driver import ControllerAgent

        single_threaded_worker()

        agent = ControllerAgent(run_dir, samples=samples, raw=raw)
        return cls(agent, observation_kind(agent.train_config.model.observation).raw_shape, agent.model.speed_input, config)

    def on_connect(self) -> dict[str, str]:
        """A new simulator session: forget the frame history and answer with a standing start."""
        self.agent.reset()
        self.law.reset()
        return dict(SAFE_REPLY)

    def on_telemetry(self, data: Any) -> Reply:
        """One telemetry message → the reply to send and its log row; never raises on bad input."""
        start = self.clock()
        self.frame += 1
        row: dict[str, Any] = {name: None for name in LOG_FIELDS}
        row.update(frame=self.frame, time=round(time.time(), 6), status="ok", reason="")
        if data is None or data == {}:
            self.agent.reset()
            row.update(status="manual", reason="empty telemetry: manual mode")
            return self._finish(Reply("manual", {}, row), start)
        try:
            steering, throttle = self._command(data, row)
        except TelemetryError as exc:
            row.update(status="safe", reason=str(exc))
            return self._finish(Reply("steer", dict(SAFE_REPLY), row), start)
        row.update(steering_angle=steering, throttle=throttle)
        return self._finish(Reply("steer", {"steering_angle": f"{steering:.6f}", "throttle": f"{throttle:.6f}"}, row), start)

    def _command(self, data: Any, row: dict[str, Any]) -> tuple[float, float]:
        """(steering, throttle) for valid telemetry, filling ``row``; :class:`TelemetryError` otherwise."""
        if not isinstance(data, dict):
            raise TelemetryError(f"telemetry: expected an object with {', '.join(TELEMETRY_FIELDS)}, got {type(data).__name__}")
        missing = [name for name in TELEMETRY_FIELDS if name not in data]
        if missing:
            raise TelemetryError(f"telemetry: missing {', '.join(missing)}")
        row["sim_steering_angle"] = telemetry_number(data, "steering_angle")
        row["sim_throttle"] = telemetry_number(data, "throttle")
        speed = row["speed"] = telemetry_number(data, "speed")
        frame = camera_to_frame(decode_camera_image(data["image"]), self.frame_shape)
        try:
            prediction = self.agent.predict(frame, speed if self.speed_input else None)
        except Exception as exc:  # a controller failure must not take the server (and the car) down
            raise TelemetryError(f"controller: {type(exc).__name__}: {exc}") from None
        moments = {"mean": prediction.mean, "aleatoric": prediction.aleatoric, "epistemic": prediction.epistemic}
        for moment, values in moments.items():
            for name, value in zip(ACTION_NAMES, values.reshape(-1).tolist()):
                row[f"{moment}_{name}"] = value
        steer, gas, brake = (row[f"mean_{name}"] for name in ACTION_NAMES)
        if not all(math.isfinite(value) for value in (steer, gas, brake)):
            raise TelemetryError("controller: non-finite prediction")
        steering = float(np.clip(steer, -1.0, 1.0))
        if self.config.throttle == "law":
            return steering, self.law(steering, speed)
        if self.config.pedal_caution is not None:
            std = np.sqrt(prediction.total.reshape(-1).tolist())  # tolist: any device, like the moments above
            _, gas, brake = cautious_pedals(np.array([steering, gas, brake]), std, self.config.pedal_caution,
                                            self.config.gas_caution)
        return steering, float(np.clip(gas - brake, -1.0, 1.0))

    def _finish(self, reply: Reply, start: float) -> Reply:
        reply.row["latency_ms"] = round(1000.0 * (self.clock() - start), 3)
        return reply


class FrameLog:
    """Per-frame log rows (:data:`LOG_FIELDS`): CSV for a ``.csv`` path, else JSON Lines.

    Flushed after every row, so a killed server loses nothing it answered. Non-finite numbers are
    written as ``nan`` in CSV and ``null`` in JSON Lines (which has no NaN). An existing file is
    replaced only with ``overwrite`` (a mistyped path must not empty a run's ``history.json``).
    """

    def __init__(self, path: str | Path, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.file = self.path.open("w" if overwrite else "x", newline="", encoding="utf-8")
        except FileExistsError:
            raise existing_log_error(self.path) from None
        self.csv = csv.DictWriter(self.file, LOG_FIELDS) if self.path.suffix.lower() == ".csv" else None
        if self.csv is not None:
            self.csv.writeheader()
            self.file.flush()

    def write(self, row: dict[str, Any]) -> None:
        if self.csv is not None:
            self.csv.writerow(row)
        else:
            clean = {key: None if isinstance(value, float) and not math.isfinite(value) else value for key, value in row.items()}
            self.file.write(json.dumps(clean) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> FrameLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def origin_allowed(environ: dict[str, Any], origins: frozenset[str]) -> bool:
    """Whether a request may reach the server: it carries no ``Origin`` (the simulator, scripts),
    its origin is one of ``origins``, or it is the server's own origin addressed by IP or
    ``localhost`` (clients like websocket-client send that; a DNS name is refused there, since a
    rebound name is how a web page would pass for the server)."""
    origin = environ.get("HTTP_ORIGIN")
    if origin is None or origin in origins:
        return True
    host = environ.get("HTTP_HOST", "")
    return origin == f"{environ.get('wsgi.url_scheme', 'http')}://{host}" and _is_local_name(host)


def _is_local_name(host: str) -> bool:
    """Whether a ``Host`` header names the server by an IP address or ``localhost``, not a DNS name."""
    try:
        name = urlsplit(f"//{host}").hostname or ""
        return name == "localhost" or ipaddress.ip_address(name) is not None
    except ValueError:
        return False


def origin_gate(app: Callable[..., Any], origins: frozenset[str]) -> Callable[..., Any]:
    """The WSGI ``app`` behind :func:`origin_allowed`: a refused request gets 403 and a logged reason."""

    def gated(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if origin_allowed(environ, origins):
            return app(environ, start_response)
        logger.warning("refused a request from origin %.100s (allow it with --cors-origin)", environ["HTTP_ORIGIN"])
        start_response("403 Forbidden", [("Content-Type", "text/plain")])
        return [b"origin not allowed (nsacdrive udacity serve --cors-origin ORIGIN allows one)\n"]

    return gated


def existing_log_error(path: Path) -> FileExistsError:
    """The refusal to replace an existing per-frame log."""
    return FileExistsError(f"--log: {path} already exists; pass --overwrite-log to replace it, or name a new file")


def parse_origins(values: list[str]) -> frozenset[str]:
    """Browser origins from ``--cors-origin`` values (repeated or comma-separated), each
    ``scheme://host[:port]`` as a browser sends it; ValueError naming a malformed one."""
    origins = frozenset(origin.strip() for value in values for origin in value.split(",") if origin.strip())
    for origin in sorted(origins):
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query or parts.fragment:
            raise ValueError(f"--cors-origin: expected an origin like http://localhost:8080 (scheme and host, no path), got {origin!r}")
    return origins


def serve(handler: TelemetryHandler, host: str = "127.0.0.1", port: int = 4567, log: FrameLog | None = None,
          on_ready: Callable[[], None] | None = None, origins: frozenset[str] = frozenset()) -> None:
    """Serve the simulator until interrupted (python-socketio 4.6.1 + python-engineio 3.13.2 on eventlet).

    ``always_connect``: the server sends the namespace CONNECT itself, before the connect handler's
    ``steer``, because the simulator never asks for it. Handlers run one at a time (the frame
    history is sequential). Origins are checked by :func:`origin_gate` (``origins``: the browser
    origins allowed besides the server's own); engineio's own check is off ("*") so that it only
    adds CORS headers for the requests the gate let through. A polling request may carry at most
    :data:`MAX_MESSAGE_BYTES` (eventlet caps a websocket frame at 8 MiB).
    """
    try:
        with warnings.catch_warnings():  # eventlet warns on import that it is in bugfix-only mode; pinned on purpose
            warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
            import eventlet
            import eventlet.wsgi
        import socketio
    except ImportError as exc:
        raise MissingExtra(f"{exc}; install the extra: pip install -e '.[udacity]'") from exc

    sio = socketio.Server(async_mode="eventlet", always_connect=True, async_handlers=False, cors_allowed_origins="*",
                          max_http_buffer_size=MAX_MESSAGE_BYTES)

    @sio.on("connect")
    def _connect(sid: str, environ: dict[str, Any]) -> None:
        logger.info("simulator connected (%s, %s)", sid, environ.get("QUERY_STRING", ""))
        sio.emit("steer", handler.on_connect(), room=sid)

    @sio.on("telemetry")
    def _telemetry(sid: str, data: Any = None) -> None:
        reply = handler.on_telemetry(data)
        if log is not None:
            log.write(reply.row)
        if reply.row["status"] == "safe":
            logger.warning("frame %d: safe reply (%s)", reply.row["frame"], reply.reason)
        sio.emit(reply.event, reply.data, room=sid)

    @sio.on("disconnect")
    def _disconnect(sid: str) -> None:
        logger.info("simulator disconnected (%s)", sid)

    listener = eventlet.listen((host, port), reuse_port=False)  # a second server on the port fails instead of sharing it
    if on_ready is not None:
        on_ready()
    eventlet.wsgi.server(listener, origin_gate(socketio.WSGIApp(sio), origins), log_output=False)
