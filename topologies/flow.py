"""The contention model: an event-driven fluid network with max-min fair sharing of link bandwidth.

A communication (collective or transfer) is a *bundle*: the bytes it moves over each directed link
(summed over its flows and phases, see topologies.collectives) and its uncontended duration T (latency
included). Alone, a bundle would occupy link l at the average rate ``demand_l = bytes_l / T``. A bundle
progresses at a rate ``y`` (1 = uncontended speed) and link l constrains ``sum_b y_b · demand_bl <=
capacity_l``. Rates are max-min fair per flow: with ``ref_b`` the bytes/s of one of the bundle's flows
(its largest per-link demand when alone; for images, the representative's), x_b = y_b · ref_b rises
together for all bundles (progressive filling) until a link saturates or a bundle reaches y = 1; frozen
bundles keep their rate and the rest go on. A bundle finishes when ``integral of y dt = T``. Rates are
recomputed when bundles start or end, only over the connected components of bundles sharing links with
them (max-min allocations decompose over components). A bundle that starts while nothing else is active on
any of its links is a component of its own: it gets its solo rate at once (no re-solve, nothing else changes).
Max-min fair allocations are unique, so three more events change nothing but this bundle: a (narrow) bundle
starting with room for its full-speed demand on every link beside the load of the active ones (it touches no
saturated link: it runs at rate 1 and every other bundle keeps its bottleneck); an end whose neighbours all
run at rate 1 (none can speed up, so none changes); and, in a re-solve, the bundles whose rate comes out the
same keep their progress mark and scheduled end.
Who shares links is indexed two ways, by the shape of the communication (its *spec*). A narrow spec (a
transfer or a small collective: few links) is looked up on its links among the *active* specs (``_on_link``),
so starting, ending or finding a component costs its few links and what is active on them, not the hundreds
of transfers that ever used a spine link at 16k GPUs. A wide spec (symmetric images, a collective across
many nodes: thousands of links, few neighbours) keeps the set of specs sharing a link with it and a count of
the active ones, as every narrow spec does of its wide neighbours.

Two bundles that want all of one link therefore get half of it each; a bundle alone finishes in exactly
its analytical time T. Approximation: a bundle's phases and latency are smeared into one average demand
(its links are loaded at the average rate over its lifetime).

Symmetric mode: a request's ``images`` (other groups running the same communication at the same instant)
join the representative's bundle: their link bytes are added, T stays one member's. N identical bundles
constrained to equal rates see exactly the same constraints as this one summed bundle, so the result
equals a full simulation that launches every image separately.
"""
from __future__ import annotations

import heapq
import math
from typing import Hashable

import numpy as np

from simulator.errors import TopologyError

_EPS = 1e-12
_PROVISIONAL_S = 1e-9     # how far past "now" a provisional next_completion answer lies
_SMALL_EDGES = 400        # up to this many (bundle, link) pairs, _max_min_small (plain Python) beats numpy
_ROOM = 1e-6              # share of a link's capacity that must stay free for a start at full speed (_enter)
_MEMO_MAX = 50_000        # solved components remembered (by their bundles' spec ids, in order)


class BundleSpec:
    """What a communication asks of the network: uncontended seconds ``T``, directed ``links`` (ids),
    ``nbytes`` moved on each, and ``ref_bytes`` (the bytes of one of its flows, for per-flow fairness).
    Derived once: ``link_list`` (Python ints), ``demand`` (bytes/s at full speed), ``ref`` (bytes/s)."""

    __slots__ = ("T", "links", "nbytes", "ref_bytes", "link_list", "demand", "ref", "demand_list")

    def __init__(self, T, links, nbytes, ref_bytes=None):
        self.T = float(T)
        links = np.asarray(links, dtype=np.int64)
        nbytes = np.asarray(nbytes, dtype=float)
        if ref_bytes is None:
            ref_bytes = float(np.max(nbytes)) if len(nbytes) else 0.0
        self.ref_bytes = ref_bytes
        if self.T > 0 and len(links):
            self.links, self.nbytes = links, nbytes
            self.demand = nbytes / self.T
            self.ref = max(ref_bytes / self.T, _EPS)
        else:
            self.links, self.nbytes, self.demand, self.ref = links[:0], nbytes[:0], nbytes[:0], 1.0
        self.link_list = self.links.tolist()
        self.demand_list = self.demand.tolist()

    def __iter__(self):               # (T, links, nbytes, ref_bytes), for callers that unpack it
        return iter((self.T, self.links, self.nbytes, self.ref_bytes))

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return (self.T, self.links, self.nbytes, self.ref_bytes)[i]


def _spec_id_of(b) -> int:
    return -1 if b.spec is None else b.spec


class _Bundle:
    __slots__ = ("key", "T", "links", "link_list", "demand", "demand_list", "ref", "progress", "rate", "t_last",
                 "version", "spec", "counted")

    def __init__(self, key, spec: BundleSpec, now):
        self.key, self.T, self.links, self.demand, self.spec = key, spec.T, spec.links, spec.demand, None
        self.ref, self.link_list, self.demand_list = spec.ref, spec.link_list, spec.demand_list
        self.progress, self.rate, self.t_last, self.version = 0.0, 1.0, now, 0
        self.counted = 0.0      # the rate its demand is counted at in FlowNetwork._load (0: not counted)

    def completion(self) -> float:
        if self.T <= 0:
            return self.t_last
        if self.rate <= 0:
            return math.inf
        return self.t_last + max(0.0, 1.0 - self.progress) * self.T / self.rate


class FlowNetwork:
    """Max-min fair fluid network over a cost model's link table (``capacity``: effective bytes/s per
    directed link). ``bundle_of(request) -> (T, link ids, bytes per link)`` comes from the cost model."""

    wide_links = 64           # a spec with more links is indexed by its neighbours, one with fewer by its links
    stop_early = True         # scans of a wide spec's neighbours stop once every active one is met (same order)
    solo_shortcut = True      # a bundle starting alone on its links takes its solo rate without a re-solve
    memo_rates = True         # a component solved before (the same specs in the same order) reuses its rates
    canonical_order = True    # a component is solved with its bundles in the order of their spec ids
    keep_unchanged = True     # a re-solve leaves the bundles whose rate it does not change as they are
    skip_full = True          # an end re-solves none of its neighbours already at full speed (rate 1)
    room_shortcut = True      # a narrow bundle with room on all its links starts at full speed, no re-solve

    def __init__(self, capacity, bundle_of, lazy: bool = True):
        self.capacity = np.asarray(capacity, dtype=float)
        self._cap_list = self.capacity.tolist()
        self._bundle_of = bundle_of
        self.lazy = lazy
        self.active: dict[Hashable, _Bundle] = {}
        # Bundles are grouped per *spec* (a cost model hands out one BundleSpec per distinct communication,
        # reused by every start of it); who shares links is indexed by link (narrow specs) or by neighbour (wide
        # ones): see the module's docstring.
        self._spec_id: dict[int, int] = {}       # id(spec) -> spec id
        self._specs: list = []                   # spec id -> the spec (kept alive: its id() stays unique)
        self._spec_keys: list[set] = []          # spec id -> keys of its active bundles
        self._solo: list = []                    # spec id -> its rate when alone (computed on first use)
        self._wide: list[bool] = []              # spec id -> more than wide_links links
        self._nbrs: list[set] = []               # spec id -> wide: the specs sharing a link; narrow: the wide ones
        self._busy: list[int] = []               # spec id -> how many of those have active bundles
        self._link_specs: dict[int, set] = {}    # link -> ids of the specs using it
        self._link_wide: dict[int, set] = {}     # link -> ids of the wide specs using it
        self._on_link: dict[int, set] = {}       # link -> ids of the narrow specs with active bundles on it
        self._owned: set = set()                 # spec ids built here from tuples: forgotten when idle
        self._heap: list = []
        self._seq = 0
        self.now = 0.0
        self.recomputes = 0
        self._rates_memo: dict[tuple, list] = {}   # spec ids of a component, in order -> its max-min rates
        self._dirty: set = set()          # bundles whose rates must be recomputed as of self.now
        self._asked = False               # last call was next_completion (with a provisional answer)
        self._load = [0.0] * len(self._cap_list)    # link -> bytes/s the bundles put on it at their counted rates

    # ------------------------------------------------------------------ engine interface
    def start(self, now_s: float, key: Hashable, request, closed: bool = False, spec=None) -> float | None:
        """Start communication ``key`` at ``now_s`` (``spec``: what ``bundle_of(request)`` gives, when the caller
        kept it from an earlier start of the same request).

        ``closed``: when the communication's rate is known at its start without a re-solve (alone on its
        links: a component of its own at its solo rate; or with room on every link: rate 1, see the module
        doc), return its end time in closed form and keep it off ``next_completion``'s heap: the caller ends
        it with ``finish_closed`` at that time. If a later start or end changes its rate before then, the
        re-solve of its component takes it back (its progress brought to that instant, its new rate, onto
        the heap: ``next_completion`` then answers for it and ``finish_closed`` returns False).
        Otherwise (or without ``closed``) returns None."""
        active = self.active
        if key in active:
            raise TopologyError(f"flow network: communication {key!r} started twice")
        self._asked = False
        if now_s != self.now:
            self._clock(now_s)
        if spec is None:
            spec = self._bundle_of(request)
        owned = not isinstance(spec, BundleSpec)
        if owned:
            spec = BundleSpec(*spec)
        b = active[key] = _Bundle(key, spec, now_s)
        if spec.link_list:
            sid = self._spec_id.get(id(spec))
            if sid is None:
                sid = self._register(spec, owned)
            b.spec = sid
            keys = self._spec_keys[sid]
            if self.room_shortcut and not self._wide[sid]:
                alone, room = self._enter(sid, spec, not keys, True)
                b.counted = 1.0
            else:
                alone, room = not keys and self._activate(sid), False
            y = None
            if alone and self.solo_shortcut:
                # alone on all its links: a component of its own, whose max-min rate is its solo rate
                y = self._solo[sid]
                if y is None:
                    y = self._solo_rate(sid)
            elif room:
                # room to spare on every link for it at full speed: nobody's rate changes, it runs at 1
                y = 1.0
            if y is not None:
                keys.add(key)
                b.rate = y
                if self.room_shortcut and y != b.counted:
                    self._count(b, y)
                if closed:
                    b.version = -1                  # off the heap: _push (a re-solve) brings it back
                    return now_s + b.T / b.rate if b.rate > 0 else math.inf     # b.completion()
                b.version = 1                       # self._push(b), inlined
                self._seq += 1
                heapq.heappush(self._heap, (b.completion(), self._seq, key, 1))
                return None
            keys.add(key)
            self._dirty.add(key)
            if not self.lazy:
                self._flush()
        elif closed:                        # no links: nothing can share them
            b.version = -1
            return b.completion()
        else:
            self._push(b)
        return None

    def finish_closed(self, now_s: float, key: Hashable) -> bool:
        """End at ``now_s`` a communication that ``start(..., closed=True)`` gave a closed-form end, and return
        True; return False (and do nothing) when a re-solve has taken it back since: it then ends when
        ``next_completion`` says, through ``finish`` (maybe already: taken back, it may end a rounding error
        earlier or within a wake-up's tolerance). Keys must not be reused."""
        b = self.active.get(key)
        if b is None or b.version >= 0:
            return False
        self.finish(now_s, key)
        return True

    def solo_time_s(self, spec) -> float | None:
        """Seconds the communication of ``spec`` (a ``BundleSpec`` or its tuple) lasts alone on its links: what
        ``start(..., closed=True)`` at ``now`` returns minus ``now`` (the same float: ``now + T / solo rate``);
        None when it would never end (a link of zero capacity). For a caller that knows no other communication
        can ever share those links (simulator.engine: links of one serial channel)."""
        if not isinstance(spec, BundleSpec):
            spec = BundleSpec(*spec)
        if not spec.link_list:
            return spec.T if spec.T > 0 else 0.0          # _Bundle.completion() at rate 1, no progress
        rate = self._rate_alone(spec)
        return spec.T / rate if rate > 0 else None

    def spec_of(self, request):
        """What ``start`` asks the cost model for ``request`` (a pure function of it), for callers that keep it."""
        return self._bundle_of(request)

    @property
    def settled(self) -> bool:
        """No rates wait to be recomputed: ``next_completion`` answers exactly."""
        return not self._dirty

    def settle(self) -> None:
        """Recompute now the rates left pending by starts and finishes at the current instant (lazy mode),
        so that ``next_completion`` answers exactly."""
        self._asked = False
        self._flush()

    def next_completion(self) -> tuple[float, Hashable] | None:
        """(time, key) of the communication that finishes next if nothing else starts, or None.

        Lazy mode (default): right after starts / finishes at time t, rates are not recomputed yet and the
        answer may be *provisional*: a time just after t (t + 1 ns), never at or before t, so an engine
        that sleeps until then and asks again (as simulator.engine does before finishing anything) gets the
        exact answer, computed once for every communication that started or ended at t. A second call in
        a row always answers exactly."""
        if self._dirty:
            top = self._top()
            if top is not None and top[0] <= self.now:
                return top                     # already done at t whatever the new rates
            if self.lazy and not self._asked:
                self._asked = True
                return self.now + _PROVISIONAL_S, (top[1] if top is not None else next(iter(self._dirty)))
            self._flush()
        self._asked = False
        return self._top()

    def finish(self, now_s: float, key: Hashable) -> None:
        """Forget communication ``key`` (finished at ``now_s``) and let the others speed up."""
        self._asked = False
        if now_s != self.now:
            self._clock(now_s)
        b = self.active.pop(key, None)
        if b is None:
            raise TopologyError(f"flow network: finish of unknown communication {key!r}")
        dirty = self._dirty
        if dirty:
            dirty.discard(key)
        if b.spec is not None:
            sid = b.spec
            keys = self._spec_keys
            mine = keys[sid]
            mine.discard(key)
            # The active bundles sharing its links may speed up: its own spec's others, narrow ones on its links
            # (a narrow spec), the counted neighbours (a wide spec: all its active ones; a narrow one: its wide
            # ones). Those running at full speed cannot (``skip_full``), and while none of them changes, no
            # bundle of the component does: the allocation left stays max-min fair, and it is unique.
            if mine:
                dirty.update(self._may_speed_up(mine))
            if self._wide[sid]:
                if b.counted:
                    self._count(b, 0.0)
                if not mine:
                    self._deactivate(sid)
            else:
                # one pass over its links: its load off, its spec off them (its last bundle), its neighbours
                load, c, on_link, last = self._load, b.counted, self._on_link, not mine
                if last:
                    busy = self._busy
                    for t in self._nbrs[sid]:
                        busy[t] -= 1
                near = set()
                for l, d in zip(b.link_list, b.demand_list):
                    if c:
                        load[l] -= c * d
                    on = on_link[l]
                    if last:
                        on.discard(sid)
                    if on:
                        near.update(on)
                near.discard(sid)
                for t in near:
                    dirty.update(self._may_speed_up(keys[t]))
                b.counted = 0.0
            if self._busy[sid]:
                for t in self._active_wide(sid, self._nbrs[sid]):
                    dirty.update(self._may_speed_up(keys[t]))
            if not mine and sid in self._owned:
                self._forget(sid)
        if not self.lazy:
            self._flush()

    # ------------------------------------------------------------------ internals
    def _top(self):
        h = self._heap
        while h:
            t, _, key, version = h[0]
            b = self.active.get(key)
            if b is None or b.version != version:
                heapq.heappop(h)
                continue
            return t, key
        return None

    def _clock(self, now_s: float) -> None:
        self._asked = False
        if now_s > self.now:
            if self._dirty:
                self._flush()               # rates changed at self.now: settle them before time moves
            self.now = now_s
        elif now_s < self.now - 1e-12 * max(1.0, abs(self.now)):
            raise TopologyError(f"flow network: time went backwards ({now_s} < {self.now})")

    def _flush(self) -> None:
        if self._dirty:
            seeds = [k for k in self._dirty if k in self.active]
            self._dirty = set()
            if seeds:
                self._resolve(self._component(seeds), self.now)

    def _push(self, b: _Bundle) -> None:
        b.version = b.version + 1 if b.version >= 0 else 1       # (-1: closed, never on the heap)
        self._seq += 1
        heapq.heappush(self._heap, (b.completion(), self._seq, b.key, b.version))

    def _may_speed_up(self, keys):
        """Those of ``keys`` (active bundles beside one that ends) that may speed up: all, or (``skip_full``)
        those below full speed."""
        if not self.skip_full:
            return keys
        active = self.active
        return [k for k in keys if active[k].rate < 1.0]

    def _count(self, b: _Bundle, y: float) -> None:
        """Count bundle ``b``'s demand at rate ``y`` in the links' load (``_enter``), instead of what it counted."""
        delta = y - b.counted
        if delta:
            load = self._load
            for l, d in zip(b.link_list, b.demand_list):
                load[l] += delta * d
            b.counted = y

    def _activate(self, sid: int) -> bool:
        """Spec ``sid`` gets its first active bundle: count it in its wide neighbours (a wide spec: in all its
        neighbours), enter it on its links (narrow). Returns whether it is alone on its links."""
        if self._wide[sid]:
            busy = self._busy
            for t in self._nbrs[sid]:
                busy[t] += 1
            return not busy[sid]
        return self._enter(sid, self._specs[sid], True, False)[0]

    def _enter(self, sid: int, spec: BundleSpec, first: bool, count: bool) -> tuple[bool, bool]:
        """A bundle of narrow spec ``sid`` starts, in one pass over its links. ``first``: its spec's first active
        bundle: count the spec in its wide neighbours and enter it on its links. ``count``: add the bundle's
        demand at rate 1 to the links' load (its caller or a re-solve then counts it at its rate). Returns
        (whether it is alone on its links, whether they have room for it at full speed).

        Room: every link keeps a margin (``_ROOM`` of its capacity) beside the counted load and its full-speed
        demand, far above the progressive filling's saturation test and the load's rounding. The allocation
        with it at rate 1 and every other bundle unchanged is then max-min fair (it touches no saturated link,
        so every other bundle keeps its bottleneck), and max-min allocations are unique: a re-solve would
        find the same rates."""
        alone = first
        if first:
            busy = self._busy
            alone = not busy[sid]
            for t in self._nbrs[sid]:
                busy[t] += 1
        on_link, load, cap = self._on_link, self._load, self._cap_list
        room = count
        for l, d in zip(spec.link_list, spec.demand_list):
            if first:
                on = on_link.get(l)
                if on is None:
                    on_link[l] = {sid}
                else:
                    if on:
                        alone = False
                    on.add(sid)
            if count:
                x = load[l] + d
                if room and x > cap[l] * (1.0 - _ROOM):
                    room = False
                load[l] = x
        return alone, room

    def _deactivate(self, sid: int) -> None:
        """Spec ``sid`` lost its last active bundle: undo ``_activate``."""
        busy = self._busy
        for t in self._nbrs[sid]:
            busy[t] -= 1
        if not self._wide[sid]:
            on_link = self._on_link
            for l in self._specs[sid].link_list:
                on_link[l].discard(sid)

    def _active_wide(self, sid: int, nbrs) -> list:
        """The specs of ``nbrs`` (``sid``'s neighbours: all of a wide spec's, a narrow one's wide ones) with active
        bundles, counted off ``_busy``: the scan stops once every active one is met."""
        keys = self._spec_keys
        left = self._busy[sid] if self.stop_early else -1
        out = []
        if left:
            for t in nbrs:
                if keys[t]:
                    out.append(t)
                    left -= 1
                    if not left:
                        break
        return out

    def _solo_rate(self, sid: int) -> float:
        """Rate of spec ``sid``'s bundle alone on its links (what ``max_min_rates`` gives one bundle)."""
        y = self._solo[sid]
        if y is None:
            spec = self._specs[sid]
            y = self._solo[sid] = self._rate_alone(spec)
        return y

    def _rate_alone(self, spec: BundleSpec) -> float:
        """The max-min rate of ``spec``'s bundle alone on its links."""
        return max_min_rates([spec.links], [spec.demand], self.capacity, [spec.ref])[0].item()

    def _register(self, spec: BundleSpec, owned: bool) -> int:
        """The spec id of ``spec`` (a new one on first use)."""
        sid = self._spec_id.get(id(spec))
        if sid is not None:
            return sid
        if len(self._spec_id) > 200_000:
            self._compact()
        sid = self._spec_id[id(spec)] = len(self._specs)
        self._specs.append(spec)
        self._spec_keys.append(set())
        self._solo.append(None)
        links = spec.link_list
        wide = len(links) > self.wide_links
        link_specs, link_wide = self._link_specs, self._link_wide
        nbrs = set()            # wide: every spec sharing a link; narrow: the wide ones
        for l in links:
            on = link_specs.get(l)
            if on is None:
                on = link_specs[l] = set()
            if wide:
                nbrs.update(on)
                w = link_wide.get(l)
                if w is None:
                    link_wide[l] = {sid}
                else:
                    w.add(sid)
            else:
                w = link_wide.get(l)
                if w:
                    nbrs.update(w)
            on.add(sid)
        nbrs.discard(sid)
        for t in nbrs:          # a wide neighbour learns of every spec, a narrow one of the wide ones
            self._nbrs[t].add(sid)
        keys = self._spec_keys
        self._wide.append(wide)
        self._nbrs.append(nbrs)
        self._busy.append(sum(1 for t in nbrs if keys[t]))
        if owned:
            self._owned.add(sid)
        return sid

    def _forget(self, sid: int) -> None:
        """Drop an idle spec and its link index (specs built here from tuples are not reused)."""
        spec = self._specs[sid]
        for index in (self._link_specs, self._link_wide):
            for l in spec.link_list:
                on = index.get(l)
                if on is not None:
                    on.discard(sid)
                    if not on:
                        del index[l]
        for t in self._nbrs[sid]:
            self._nbrs[t].discard(sid)
        self._nbrs[sid] = self._spec_keys[sid] = self._solo[sid] = None
        del self._spec_id[id(spec)]
        self._specs[sid] = None
        self._owned.discard(sid)

    def _compact(self) -> None:
        """Forget every idle spec (bounds the index when a run meets very many distinct communications)."""
        for sid, spec in enumerate(self._specs):
            if spec is not None and not self._spec_keys[sid]:
                self._owned.add(sid)
                self._forget(sid)

    def _component(self, seeds) -> list:
        """Keys of the bundles connected to ``seeds`` through shared links (of bundles still active)."""
        seen = set(seeds)
        active = self.active
        keys = self._spec_keys
        stack = list({active[k].spec for k in seeds if active[k].spec is not None})
        seen_specs = set(stack)
        wide, nbrs, busy, specs, on_link = self._wide, self._nbrs, self._busy, self._specs, self._on_link
        while stack:
            sid = stack.pop()
            seen.update(keys[sid])
            if not wide[sid]:               # the narrow specs active on its links (itself among them)
                for l in specs[sid].link_list:
                    for t in on_link[l]:
                        if t not in seen_specs:
                            seen_specs.add(t)
                            stack.append(t)
            if busy[sid]:                   # its active wide neighbours (a wide spec: all its active ones)
                for t in self._active_wide(sid, nbrs[sid]):
                    if t not in seen_specs:
                        seen_specs.add(t)
                        stack.append(t)
        return list(seen)

    def _resolve(self, keys, now_s: float) -> None:
        """Recompute the component's max-min rates; bring the progress of the bundles whose rate changes to
        now and reschedule their completions.

        A bundle whose rate comes out unchanged (most of them: a transfer joining links with room to spare
        changes no neighbour's rate) keeps its progress mark, its heap entry, or its closed-form end
        (``keep_unchanged``): its progress is integrated at one rate from its mark whenever that rate changes,
        and its completion stays the one computed when the rate was set."""
        self.recomputes += 1
        pushed = bundles = [self.active[k] for k in keys]
        # The rates are a function of the bundles' specs in this order: the same component again (periodic
        # schedules repeat them) takes the rates solved the first time, bit for bit. Solved in the order of
        # their spec ids (canonical_order), a component meets its earlier solves whatever order its bundles
        # were found in (bundles of one spec get equal rates); they are still rescheduled in that order.
        if self.canonical_order:
            bundles = sorted(bundles, key=_spec_id_of)
        sig = tuple([b.spec for b in bundles])
        memo = self._rates_memo
        rates = memo.get(sig)
        if rates is None:
            if sum(len(b.link_list) for b in bundles) <= _SMALL_EDGES:
                rates = _max_min_small([b.link_list for b in bundles], [b.demand_list for b in bundles],
                                       self._cap_list, [b.ref for b in bundles])
            else:
                rates = max_min_rates([b.links for b in bundles], [b.demand for b in bundles], self.capacity,
                                      [b.ref for b in bundles]).tolist()
            if self.memo_rates and None not in sig:
                if len(memo) >= _MEMO_MAX:
                    memo.clear()
                memo[sig] = rates
        keep = self.keep_unchanged
        count = self.room_shortcut
        moved = []
        for b, y in zip(bundles, rates):
            if keep and b.rate == y and b.version:      # version 0: a bundle never scheduled (just started)
                continue
            if b.T > 0:
                b.progress = min(1.0, b.progress + b.rate * (now_s - b.t_last) / b.T)
            b.t_last = now_s
            b.rate = y
            if count:
                self._count(b, y)
            moved.append(b)
        if len(moved) < len(pushed):
            moved = set(moved)
            pushed = [b for b in pushed if b in moved]
        for b in pushed:
            self._push(b)
        if len(self._heap) > 4 * len(self.active) + 1024:     # drop superseded entries now and then
            act = self.active
            self._heap = [e for e in self._heap if (b := act.get(e[2])) is not None and b.version == e[3]]
            heapq.heapify(self._heap)


def max_min_rates(links_list, demand_list, capacity, ref=None) -> np.ndarray:
    """Max-min fair rates by progressive filling; returns each bundle's progress rate y in [0, 1].

    links_list[b], demand_list[b]: link ids and the bytes/s bundle b puts on them at y = 1.
    ref[b]: the bundle's reference rate (default: its largest per-link demand), i.e. the bytes/s of one of
    its flows. Fairness is in x_b = y_b · ref_b (bytes/s per flow): x rises together for every unfrozen
    bundle; a bundle freezes when x reaches its ref (it runs uncontended, y = 1) or when a link it uses
    saturates. So two flows that each want a whole link get half each, and a flow that wants less than
    its fair share of a link is not slowed by it."""
    nb = len(links_list)
    if nb == 0:
        return np.zeros(0)
    if ref is None:
        ref = [float(np.max(d)) if len(d) else 1.0 for d in demand_list]
    ref = np.maximum(np.asarray(ref, dtype=float), _EPS)
    if nb == 1:
        l, d = links_list[0], demand_list[0]
        if not len(l):
            return np.ones(1)
        return np.array([min(1.0, float(np.min(capacity[l] / np.maximum(d, _EPS))))])
    sizes = [len(l) for l in links_list]
    eb = np.repeat(np.arange(nb), sizes)
    el_global = np.concatenate(links_list)
    ea = np.concatenate(demand_list) / ref[eb]          # link bytes/s per unit of x
    uniq, el = np.unique(el_global, return_inverse=True)
    resid = capacity[uniq].astype(float).copy()
    cap0 = resid.copy()
    x = np.zeros(nb)
    frozen = np.zeros(nb, dtype=bool)
    level = 0.0
    for _ in range(2 * nb + 1):
        live_b = ~frozen
        live = live_b[eb]
        D = np.bincount(el, weights=ea * live, minlength=len(uniq))
        used = D > _EPS
        step = float(np.min(ref[live_b])) - level
        if used.any():
            step = min(step, float(np.min(resid[used] / D[used])))
        step = max(step, 0.0)
        level += step
        resid -= step * D
        done = live_b & (ref <= level * (1 + 1e-12))
        sat = used & (resid <= 1e-9 * cap0)
        hit = np.zeros(nb, dtype=bool)
        hit[eb[live & sat[el]]] = True
        newly = done | hit
        if not newly.any():          # numerical corner: freeze everyone at the current level
            newly = live_b
        # a bundle that reached its ref (to the test's tolerance) runs at full speed, y = 1 exactly: as one that
        # starts with room (FlowNetwork's room shortcut) or alone on links of room to spare
        x[newly] = np.where(done[newly], ref[newly], level)
        frozen |= newly
        if frozen.all():
            break
    return np.minimum(1.0, x / ref)


def _max_min_small(links_list, demand_list, capacity, ref) -> list[float]:
    """``max_min_rates`` for small components in plain Python (numpy's per-call overhead dominates below a few
    hundred (bundle, link) pairs): the same progressive filling, the same operations in the same order, so
    the same rates to the last bit (tests/topologies/test_flow.py checks it). Lists in, list out."""
    nb = len(links_list)
    if nb == 1:
        if not links_list[0]:
            return [1.0]
        return [min(1.0, min(capacity[l] / (d if d > _EPS else _EPS) for l, d in zip(links_list[0], demand_list[0])))]
    ref = [r if r > _EPS else _EPS for r in ref]
    slot: dict = {}
    cap0: list = []
    edges = []                     # bundle -> [(link slot, link bytes/s per unit of x)]
    for b in range(nb):
        rb = ref[b]
        e = []
        for l, d in zip(links_list[b], demand_list[b]):
            j = slot.get(l)
            if j is None:
                j = slot[l] = len(cap0)
                cap0.append(float(capacity[l]))
            e.append((j, d / rb))
        edges.append(e)
    nl = len(cap0)
    resid = cap0[:]
    x = [0.0] * nb
    live = list(range(nb))
    level = 0.0
    for _ in range(2 * nb + 1):
        D = [0.0] * nl
        for b in live:
            for j, a in edges[b]:
                D[j] += a
        step = min(ref[b] for b in live) - level
        for j in range(nl):
            if D[j] > _EPS:
                q = resid[j] / D[j]
                if q < step:
                    step = q
        if step < 0.0:
            step = 0.0
        level += step
        for j in range(nl):
            resid[j] -= step * D[j]
        sat = [D[j] > _EPS and resid[j] <= 1e-9 * cap0[j] for j in range(nl)]
        lim = level * (1 + 1e-12)
        newly = [b for b in live if ref[b] <= lim or any(sat[j] for j, _ in edges[b])]
        if not newly:              # numerical corner: freeze everyone at the current level
            newly = live
        for b in newly:
            x[b] = ref[b] if ref[b] <= lim else level
        if len(newly) == len(live):
            break
        gone = set(newly)
        live = [b for b in live if b not in gone]
    return [min(1.0, x[b] / ref[b]) for b in range(nb)]


def drive(net, starts, tol: float = 1e-15, closed: bool = False) -> dict:
    """Run a network the way simulator.engine does: ``starts`` = [(time, key, request)]; sleep until the
    next completion, ask again, finish what is due. Returns {key: finish time}. ``closed``: start with
    ``closed=True`` and end the communications it gives a closed-form end (alone on their links, or with room
    on all of them) at that end (``finish_closed``; nothing when taken back since), after the starts of that
    instant."""
    pending = sorted(starts, key=lambda s: s[0])
    done: dict = {}
    ends: list = []             # closed-form ends: (time, order, key)
    i = 0
    while True:
        nxt = net.next_completion()
        t_next = nxt[0] if nxt is not None else math.inf
        if ends and ends[0][0] <= t_next and (i >= len(pending) or ends[0][0] < pending[i][0]):
            t, _, key = heapq.heappop(ends)
            if net.finish_closed(t, key):
                done[key] = t
            continue
        if i < len(pending) and pending[i][0] <= t_next:
            t, key, req = pending[i]
            i += 1
            end = net.start(t, key, req, True) if closed else net.start(t, key, req)
            if end is not None and end < math.inf:
                heapq.heappush(ends, (end, i, key))
            continue
        if nxt is None:
            return done
        now = t_next
        while True:                     # wake-up: finish everything due now
            n2 = net.next_completion()
            if n2 is None or n2[0] > now + tol * max(1.0, now):
                break
            net.finish(now, n2[1])
            done[n2[1]] = now


class UncontendedNetwork:
    """FlowNetwork interface without contention: each communication takes its analytical time."""

    def __init__(self, time_of):
        self._time_of = time_of
        self._heap: list = []
        self._done: dict = {}
        self._seq = 0

    def start(self, now_s: float, key: Hashable, request) -> None:
        if key in self._done:
            raise TopologyError(f"network: communication {key!r} started twice")
        t = now_s + self._time_of(request)
        self._seq += 1
        self._done[key] = self._seq
        heapq.heappush(self._heap, (t, self._seq, key))

    def next_completion(self):
        while self._heap and self._done.get(self._heap[0][2]) != self._heap[0][1]:
            heapq.heappop(self._heap)
        return (self._heap[0][0], self._heap[0][2]) if self._heap else None

    def finish(self, now_s: float, key: Hashable) -> None:
        if self._done.pop(key, None) is None:
            raise TopologyError(f"network: finish of unknown communication {key!r}")
