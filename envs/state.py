"""Privileged state of a CarRacing car: what experts and state-based RL observe instead of pixels."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from nsacdrive.envs.geometry import TrackGeometry, TrackProjection, wrap_angle

#: Distances (world units) ahead of the car's projection at which curvature is sampled.
CURVATURE_LOOKAHEAD = np.array([5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 80.0])

STATE_FIELDS: tuple[str, ...] = (
    "forward_speed",
    "lateral_speed",
    "yaw_rate",
    "steering_angle",
    "front_wheel_slip",
    "rear_wheel_slip",
    "lateral_error",
    "heading_error",
    "progress_fraction",
    *(f"curvature_{int(d)}" for d in CURVATURE_LOOKAHEAD),
)

#: Named subsets of :data:`STATE_FIELDS` a state policy may read. ``camera``: what a student's
#: top-down frames (about 37 units of road ahead) and speed input show it, so a teacher reading
#: only these decides on what its student can see: speeds and yaw rate (over a frame sequence),
#: the front wheels' angle, the pose on the road and curvature up to 30 units ahead; not the
#: wheel slips, the lap's progress or the curvature beyond the frame.
STATE_FIELD_SETS: dict[str, tuple[str, ...]] = {
    "all": STATE_FIELDS,
    "camera": ("forward_speed", "lateral_speed", "yaw_rate", "steering_angle", "lateral_error", "heading_error",
               *(f"curvature_{int(d)}" for d in CURVATURE_LOOKAHEAD if d <= 30)),
}


def state_columns(field_set: str) -> np.ndarray:
    """Indices into :meth:`PrivilegedState.as_vector` of the fields named by ``field_set``."""
    if field_set not in STATE_FIELD_SETS:
        raise ValueError(f"state fields must be one of {', '.join(STATE_FIELD_SETS)}, got {field_set!r}")
    return np.array([STATE_FIELDS.index(name) for name in STATE_FIELD_SETS[field_set]])


@dataclass(frozen=True)
class CarPose:
    """Pose and velocities of the hull; speeds in world units/s, angles in rad."""

    x: float
    y: float
    angle: float  # wrapped hull angle (the env's convention: forward = (-sin, cos))
    forward_speed: float  # + forward
    lateral_speed: float  # + right
    yaw_rate: float  # + counter-clockwise
    steering_angle: float  # front wheel joint angle (+ = wheels turned left)
    front_wheel_slip: float  # mean wheel rim speed − forward speed: < 0 braking skid
    rear_wheel_slip: float  # > 0 wheel spin under throttle (rear-wheel drive)

    @property
    def position(self) -> np.ndarray:
        return np.array([self.x, self.y])

    @property
    def speed(self) -> float:
        return float(np.hypot(self.forward_speed, self.lateral_speed))

    @property
    def right(self) -> np.ndarray:
        """Unit vector to the car's right (the env's convention: forward = (−sin, cos))."""
        return np.array([np.cos(self.angle), np.sin(self.angle)])


def forward_speed(car) -> float:
    """The hull's forward speed alone (what a speedometer reads; cheaper than :func:`car_pose`)."""
    hull = car.hull
    return float(hull.GetLocalVector(hull.linearVelocity)[1])


def car_pose(car) -> CarPose:
    """Read the pose of a gymnasium ``Car`` (``env.unwrapped.car``)."""
    hull = car.hull
    local_velocity = hull.GetLocalVector(hull.linearVelocity)  # +x right, +y forward
    return CarPose(
        x=float(hull.position[0]),
        y=float(hull.position[1]),
        angle=float(wrap_angle(hull.angle)),
        forward_speed=float(local_velocity[1]),
        lateral_speed=float(local_velocity[0]),
        yaw_rate=float(hull.angularVelocity),
        steering_angle=float(car.wheels[0].joint.angle),
        front_wheel_slip=_wheel_slip(car.wheels[:2], local_velocity[1]),
        rear_wheel_slip=_wheel_slip(car.wheels[2:], local_velocity[1]),
    )


def _wheel_slip(wheels, forward_speed: float) -> float:
    return float(sum(w.omega * w.wheel_rad for w in wheels) / len(wheels) - forward_speed)


@dataclass(frozen=True)
class PrivilegedState:
    """Car pose plus its relation to the track; ``as_vector`` follows :data:`STATE_FIELDS`."""

    pose: CarPose
    projection: TrackProjection
    heading_error: float
    geometry: TrackGeometry  # the track itself, for agents that plan along it

    @cached_property
    def curvature_ahead(self) -> np.ndarray:
        """Curvature at :data:`CURVATURE_LOOKAHEAD` ahead (> 0 turns left); computed when first read
        (the state vector reads it, the closed-loop evaluator's every-step state does not)."""
        return self.geometry.curvature_ahead(self.projection.progress, CURVATURE_LOOKAHEAD)

    @property
    def lateral_error(self) -> float:
        return float(self.projection.lateral_error)

    @property
    def progress(self) -> float:
        return float(self.projection.progress)

    def as_vector(self) -> np.ndarray:
        pose = self.pose
        return np.array(
            [
                pose.forward_speed,
                pose.lateral_speed,
                pose.yaw_rate,
                pose.steering_angle,
                pose.front_wheel_slip,
                pose.rear_wheel_slip,
                self.lateral_error,
                self.heading_error,
                float(self.projection.progress_fraction),
                *self.curvature_ahead,
            ],
            dtype=np.float32,
        )


def privileged_state(env) -> PrivilegedState:
    """The privileged state of an :class:`nsacdrive.envs.car_racing.NsacCarRacing` (any wrapper depth)."""
    base = env.unwrapped
    geometry: TrackGeometry | None = getattr(base, "geometry", None)
    if geometry is None or base.car is None:
        raise RuntimeError("privileged_state needs an NsacCarRacing env that has been reset")
    return state_at(car_pose(base.car), geometry)


def state_at(pose: CarPose, geometry: TrackGeometry) -> PrivilegedState:
    """The privileged state of a car with ``pose`` on the track ``geometry``."""
    projection = geometry.project(pose.position)
    return PrivilegedState(
        pose=pose,
        projection=projection,
        heading_error=float(geometry.heading_error(pose.angle, projection.segment_index)),
        geometry=geometry,
    )


def shifted_sideways(state: PrivilegedState, offset: float) -> PrivilegedState:
    """The same car moved ``offset`` units to its right (negative: left), heading and speeds kept:
    the state a side camera sees the road from, which a state-reading teacher can label."""
    pose = state.pose
    x, y = pose.position + offset * pose.right
    return state_at(replace(pose, x=float(x), y=float(y)), state.geometry)
