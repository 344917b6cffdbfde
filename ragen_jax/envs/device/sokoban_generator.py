"""On-device Sokoban level generation with RAGEN's recipe, static shapes throughout.

Dimensions: H, W room rows and columns; N = H * W flat cells; K boxes; M candidate rooms per
round; R reverse walks per room; L steps per walk. Cells are flat indices `r * W + c`.

The recipe (RAGEN's copy of gym-sokoban's generator, ../shared/reference/envs.md §2.2-2.3):
  1. Topology: a random walk of `num_gen_steps` steps from a random cell, redrawing its direction
     with probability 0.35, clamped to the interior, stamping one of five 3x3 floor masks per
     step; the outer ring is wall.
  2. Placement: the player and K targets on distinct uniformly random floor cells (needs more
     than K + 1 floor cells).
  3. Reverse play from the solved state with pull-only moves (a move away from an adjacent box
     drags it along). RAGEN runs an exhaustive depth-first search bounded by `search_depth`;
     here R random walks of L = `search_depth` steps run in parallel, and the state with the
     largest score is kept: score = box swaps x total box displacement (Manhattan, box to its
     own target), forced to 0 while any box or the player stands on a target. Swaps count the
     pulls that change which box is pulled, the first pull counting one (RAGEN's fixed count).
     The first strictly better state along a walk wins, so the player starts next to the box it
     last pulled, as in RAGEN.
  4. RAGEN's player shuffle: with probability 0.8 if the total displacement is 1 (else 0.5) the
     player walks 1 to 3 steps through free cells without revisiting one, continuing after
     each step with probability 0.5.
A room is accepted when placement fits and some box moved; M candidates are drawn per round
and the first accepted one is used; rounds repeat (rarely) until one is accepted. Every level
is solvable because each reverse pull is undone by a push and the shuffle walks free cells.
"""

import functools
from typing import Optional, Tuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from ragen_jax.envs.device import base

# Walk directions (row, col): down, right, up, left, as gym-sokoban's topology walk. Numpy, not
# jnp: importing the package must not start a JAX backend (jax.distributed.initialize comes first).
_WALK_DIRS = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], np.int32)
# The five 3x3 floor stamps of gym-sokoban's topology walk, centred on the walker.
_MASKS_5x3x3 = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    np.bool_,
)
_CHANGE_DIRECTION_PROB = 0.35
_MAX_ROUNDS = 64
# Levels per chunk of a batch, by backend. On a CPU, chunks of 256 keep the reverse walks'
# working set in cache (a whole 4096-level batch spills out and runs about 1.5x slower per
# level); an accelerator runs the batch in one chunk, half the sequential depth at 512 levels.
_CHUNK_BY_BACKEND = {"cpu": 256}


def topology(key: jax.Array, dim: Tuple[int, int], num_steps: int) -> jax.Array:
  """Returns floor_HxW (bool): the random-walk room, border forced to wall."""
  h, w = dim
  k_dir, k_pos, k_walk = jax.random.split(key, 3)
  direction = jax.random.randint(k_dir, (), 0, 4)
  # Start coordinates are uniform in [1, dim - 1] inclusive, as gym-sokoban draws them.
  pos = jax.random.randint(k_pos, (2,), 1, jnp.array([h, w]))
  rows = jnp.arange(h)[:, None]
  cols = jnp.arange(w)[None, :]

  # All randomness is drawn up front: one threefry call per array keeps compiles short.
  k_change, k_new, k_mask = jax.random.split(k_walk, 3)
  draws = (
      jax.random.uniform(k_change, (num_steps,)) < _CHANGE_DIRECTION_PROB,
      jax.random.randint(k_new, (num_steps,), 0, 4),
      jax.random.randint(k_mask, (num_steps,), 0, 5),
  )

  def walk_step(carry, draw):
    pos, direction, floor = carry
    change, new_direction, mask_id = draw
    direction = jnp.where(change, new_direction, direction)
    pos = jnp.clip(pos + jnp.asarray(_WALK_DIRS)[direction], 1, jnp.array([h - 2, w - 2]))
    dr, dc = rows - (pos[0] - 1), cols - (pos[1] - 1)
    inside = (dr >= 0) & (dr < 3) & (dc >= 0) & (dc < 3)
    stamp = jnp.asarray(_MASKS_5x3x3)[mask_id][jnp.clip(dr, 0, 2), jnp.clip(dc, 0, 2)] & inside
    return (pos, direction, floor | stamp), None

  floor = jnp.zeros((h, w), jnp.bool_)
  (_, _, floor), _ = lax.scan(walk_step, (pos, direction, floor), draws)
  border = (rows == 0) | (rows == h - 1) | (cols == 0) | (cols == w - 1)
  return floor & ~border


def _manhattan(a_K, b_K, width):
  return jnp.abs(a_K // width - b_K // width) + jnp.abs(a_K % width - b_K % width)


def _reverse_walk(key, floor_N, player, targets_K, width, length):
  """One random pull-only walk from the solved state; returns its best (score, player, boxes)."""
  deltas = jnp.array([-width, width, -1, 1], jnp.int32)

  def body(carry, d):
    player, boxes_K, last, swaps, best = carry
    new = player + d
    free = floor_N[new] & ~jnp.any(boxes_K == new)
    # Pull: the box directly behind the player follows it into the player's old cell.
    pulled_K = (boxes_K == player - d) & free
    boxes_K = jnp.where(pulled_K, player, boxes_K)
    any_pull = jnp.any(pulled_K)
    idx = jnp.argmax(pulled_K)
    swaps = swaps + (any_pull & (idx != last)).astype(jnp.int32)
    last = jnp.where(any_pull, idx, last)
    player = jnp.where(free, new, player)
    on_target = jnp.any(boxes_K[:, None] == targets_K[None, :]) | jnp.any(player == targets_K)
    score = jnp.where(on_target, 0, swaps * jnp.sum(_manhattan(boxes_K, targets_K, width)))
    best = jax.tree.map(
        lambda new_, old: jnp.where(score > best[0], new_, old), (score, player, boxes_K), best
    )
    return (player, boxes_K, last, swaps, best), None

  init = (player, targets_K, jnp.int32(-1), jnp.int32(0), (jnp.int32(0), player, targets_K))
  (_, _, _, _, best), _ = lax.scan(body, init, deltas[jax.random.randint(key, (length,), 0, 4)])
  return best


def _shuffle_player(key, floor_N, boxes_K, player, displacement, width):
  """RAGEN's extra 1-3 step player walk through free cells without revisiting."""
  deltas = jnp.array([-width, width, -1, 1], jnp.int32)
  u_move, *u_continue = jax.random.uniform(key, (4,))
  u_pick_3x4 = jax.random.uniform(jax.random.fold_in(key, 1), (3, 4))
  going = u_move < jnp.where(displacement == 1, 0.8, 0.5)
  visited = jnp.full((4,), -1, jnp.int32).at[0].set(player)
  for i in range(3):
    cand_4 = player + deltas
    ok_4 = (
        floor_N[cand_4]
        & ~jnp.any(cand_4[:, None] == boxes_K[None, :], axis=1)
        & ~jnp.any(cand_4[:, None] == visited[None, :], axis=1)
    )
    pick = jnp.argmax(jnp.where(ok_4, u_pick_3x4[i], -1.0))
    moving = going & jnp.any(ok_4)
    player = jnp.where(moving, cand_4[pick], player)
    visited = visited.at[i + 1].set(player)
    going = moving & (u_continue[i] < 0.5)
  return player


def _room(key, dim, num_boxes, num_gen_steps):
  """Topology and placement: returns (usable, floor_N, player, targets_K)."""
  h, w = dim
  k_topo, k_place = jax.random.split(key)
  floor_HxW = topology(k_topo, dim, num_gen_steps)
  floor_N = floor_HxW.reshape(-1)
  fits = jnp.sum(floor_N) > num_boxes + 1
  noise_N = jnp.where(floor_N, jax.random.uniform(k_place, (h * w,)), -1.0)
  _, cells = lax.top_k(noise_N, num_boxes + 1)
  player, targets_K = cells[0], cells[1:]
  # A room whose boxes cannot be pulled at all is rejected before the costly reverse walks
  # (RAGEN's generator rejects it after its search instead): flood-fill the player's free
  # region, then look for a reachable cell next to a box with a free cell beyond it.
  free_HxW = floor_HxW & ~jnp.zeros((h * w,), jnp.bool_).at[targets_K].set(True).reshape(h, w)
  seed = jnp.zeros((h * w,), jnp.bool_).at[player].set(True).reshape(h, w)
  reach = base.flood_fill(seed, free_HxW, (h - 2) * (w - 2))
  pad_reach, pad_free = jnp.pad(reach, 2), jnp.pad(free_HxW, 2)
  rows, cols = targets_K // w + 2, targets_K % w + 2
  pullable = jnp.zeros((), jnp.bool_)
  for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
    pullable |= jnp.any(pad_reach[rows + dr, cols + dc] & pad_free[rows + 2 * dr, cols + 2 * dc])
  return fits & pullable, floor_N, player, targets_K


def _candidate(key, dim, num_boxes, num_gen_steps, search_depth, num_walks, num_candidates):
  """One round: the first usable of M rooms, reverse-played; returns (accepted, room...)."""
  w = dim[1]
  k_rooms, k_walks, k_shuffle = jax.random.split(key, 3)
  usable_M, floor_MxN, player_M, targets_MxK = jax.vmap(
      functools.partial(_room, dim=dim, num_boxes=num_boxes, num_gen_steps=num_gen_steps)
  )(jax.random.split(k_rooms, num_candidates))
  i = jnp.argmax(usable_M)  # The first usable room, as RAGEN's sequential tries.
  floor_N, player, targets_K = floor_MxN[i], player_M[i], targets_MxK[i]
  walk = functools.partial(
      _reverse_walk,
      floor_N=floor_N,
      player=player,
      targets_K=targets_K,
      width=w,
      length=search_depth,
  )
  scores_R, players_R, boxes_RxK = jax.vmap(walk)(jax.random.split(k_walks, num_walks))
  best = jnp.argmax(scores_R)
  boxes_K, player = boxes_RxK[best], players_R[best]
  displacement = jnp.sum(_manhattan(boxes_K, targets_K, w))
  player = _shuffle_player(k_shuffle, floor_N, boxes_K, player, displacement, w)
  accepted = usable_M[i] & (scores_R[best] > 0)
  return accepted, floor_N, targets_K, boxes_K, player


def chunk_size(batch: int, backend: Optional[str] = None) -> int:
  """Levels per chunk of the first round for `backend` (default: JAX's default backend)."""
  return min(batch, _CHUNK_BY_BACKEND.get(backend or jax.default_backend(), batch))


def generate(
    keys_B: jax.Array,
    dim: Tuple[int, int],
    num_boxes: int,
    num_gen_steps: int,
    search_depth: int,
    num_walks: int,
    num_candidates: int,
    chunk: Optional[int] = None,
):
  """Generates a batch of levels, one per key.

  Each level is the first accepted round of `_candidate(fold_in(key, r))` for r = 0, 1, ...,
  so a key gives the same level whatever batch it is in. Round 0 runs for the whole batch;
  the rare rejected levels are then redone a few at a time (the failed lanes are gathered,
  retried and scattered back), so a batch of thousands never pays a whole second round.

  Args:
    keys_B: [B] PRNG keys.
    dim: (H, W) room size, static.
    num_boxes: K, static.
    num_gen_steps: topology walk length (RAGEN: int(1.7 * (H + W))).
    search_depth: L, steps of each reverse walk.
    num_walks: R parallel reverse walks per room.
    num_candidates: M rooms drawn per round; the first usable one is reverse-played.
    chunk: levels generated at once in the first round; None: `chunk_size` of the backend.

  Returns:
    (floor_BxN bool, targets_BxK int32 cells, boxes_BxK int32 cells, player_B int32 cell,
    accepted_B bool); `accepted` is False only if a level failed `_MAX_ROUNDS` rounds, which
    the tests check never happens.
  """
  batch = keys_B.shape[0]
  attempt = jax.vmap(
      functools.partial(
          _candidate,
          dim=dim,
          num_boxes=num_boxes,
          num_gen_steps=num_gen_steps,
          search_depth=search_depth,
          num_walks=num_walks,
          num_candidates=num_candidates,
      )
  )
  retry_slots = min(batch, 8)
  fold = jax.vmap(jax.random.fold_in)

  def cond(carry):
    tries_B, result = carry
    return jnp.any(~result[0] & (tries_B < _MAX_ROUNDS))

  def body(carry):
    tries_B, result = carry
    pending_B = ~result[0] & (tries_B < _MAX_ROUNDS)
    _, idx_S = lax.top_k(pending_B.astype(jnp.float32), retry_slots)
    redo_S = pending_B[idx_S]
    fresh = attempt(fold(keys_B[idx_S], tries_B[idx_S]))
    result = jax.tree.map(
        lambda old, new: old.at[idx_S].set(
            jnp.where(redo_S.reshape((-1,) + (1,) * (new.ndim - 1)), new, old[idx_S])
        ),
        result,
        fresh,
    )
    return tries_B.at[idx_S].add(redo_S.astype(jnp.int32)), result

  one = functools.partial(
      _candidate,
      dim=dim,
      num_boxes=num_boxes,
      num_gen_steps=num_gen_steps,
      search_depth=search_depth,
      num_walks=num_walks,
      num_candidates=num_candidates,
  )
  chunk = min(batch, chunk or chunk_size(batch))
  first = lax.map(one, fold(keys_B, jnp.zeros((batch,), jnp.int32)), batch_size=chunk)
  _, (accepted, floor_BxN, targets_BxK, boxes_BxK, player_B) = lax.while_loop(
      cond, body, (jnp.ones((batch,), jnp.int32), first)
  )
  return floor_BxN, targets_BxK, boxes_BxK, player_B, accepted
