import * as Either from "effect/Either"
import type { Device } from "../../node/Devices.js"

/**
 * Where a unit task's executors run: a pure policy over plain data, like a scheduler. Given the
 * cluster's nodes, the devices already held, and the executors to place, it answers which node and
 * devices each executor gets, or why they do not fit. It holds nothing and does no I/O; the caller
 * records the answer as holdings.
 */

export interface PlacementNode {
  readonly name: string
  readonly state: "ready" | "lost"
  readonly devices: ReadonlyArray<Device>
}

/** A device some task already holds on a node (a shared CPU device: one holding per task). */
export interface Holding {
  readonly node: string
  readonly device: string
  readonly task: string
}

/** A group of devices on one node that already runs one of the task's executors. */
export interface PreferredGroup {
  readonly node: string
  readonly devices: ReadonlyArray<string>
}

export interface PlacementRequest {
  readonly task: string
  /** How many executors to place now. */
  readonly executors: number
  /** Devices each executor holds, all on one node; at least one. */
  readonly devicesPerExecutor: number
  /** Tasks this one exchanges tensors with, producers and consumers alike. */
  readonly related: ReadonlyArray<string>
  /** Taken first, each group as one executor, when all its devices are free on a ready node. */
  readonly preferred?: ReadonlyArray<PreferredGroup>
  readonly avoidNodes?: ReadonlyArray<string>
  /**
   * When no node has the free devices an executor needs, it may share CPU devices other tasks
   * hold (never a GPU, never a device the task holds already), the least shared first.
   */
  readonly share?: boolean
  /** With `share`: the only devices it may share (rebalancing chose them), all on `node`. */
  readonly shareOn?: { readonly node: string; readonly devices: ReadonlyArray<string> }
}

export interface PlacedExecutor {
  readonly task: string
  readonly node: string
  readonly devices: ReadonlyArray<Device>
  /**
   * ONNX Runtime threads per device: a CPU device's whole budget when the executor has it alone,
   * else its share (the budget over the executors on it, this one included; at least 1).
   */
  readonly threads: number
  /** Why it went there, in a few words. */
  readonly reason: string
}

/** How much room a ready node had left for the task that did not fit. */
export interface NodeRoom {
  readonly node: string
  readonly free: number
  readonly total: number
  readonly avoided: boolean
}

/** A request that did not fit; nothing of the call was placed. */
export interface PlacementShortfall {
  readonly _tag: "PlacementShortfall"
  readonly task: string
  readonly devicesPerExecutor: number
  readonly executors: number
  /** Executors of `task` that found no node. */
  readonly unplaced: number
  /** Ready nodes, counting the devices taken by the requests placed before this one in the call. */
  readonly room: ReadonlyArray<NodeRoom>
  /** Devices the requests placed before this one in the call would have taken. */
  readonly takenByEarlier: number
  readonly message: string
}

/** Each ready node's devices that nobody holds, in the node's order; lost nodes are left out. */
export const freeDevices = (
  nodes: ReadonlyArray<PlacementNode>,
  holdings: ReadonlyArray<Holding>
): ReadonlyMap<string, ReadonlyArray<Device>> => {
  const held = heldDevices(holdings)
  const free = new Map<string, ReadonlyArray<Device>>()
  for (const node of nodes) {
    if (node.state !== "ready" || free.has(node.name)) continue
    const heldHere = held.get(node.name)
    free.set(
      node.name,
      node.devices.filter((device) => heldHere === undefined || !heldHere.has(device.id))
    )
  }
  return free
}

/**
 * Places every request's executors, in the order given, or none of them.
 *
 * Rules, in order: only ready nodes, never a held device, never an avoided node, all of an
 * executor's devices on one node, taken in the node's order; the request's preferred groups first;
 * then the node where related tasks hold the most devices (counting this call's earlier
 * placements, so tasks placed together land together when they fit); otherwise the node with the
 * most free devices, then the one with the fewest of this task's executors, then by name. A
 * request that may share, and finds no free devices, then shares CPU devices (see `share`).
 */
export const place = (
  nodes: ReadonlyArray<PlacementNode>,
  holdings: ReadonlyArray<Holding>,
  requests: ReadonlyArray<PlacementRequest>
): Either.Either<ReadonlyArray<PlacedExecutor>, PlacementShortfall> => {
  const ledger = makeLedger(nodes, holdings)
  const relatedOf = relations(requests)
  const placed: Array<PlacedExecutor> = []
  for (const request of requests) {
    const size = Math.max(1, request.devicesPerExecutor)
    const avoided = new Set(request.avoidNodes ?? [])
    const related = relatedOf.get(request.task) ?? new Set<string>()
    for (let placedOfRequest = 0; placedOfRequest < request.executors; placedOfRequest++) {
      const executor =
        takePreferred(ledger, request, size, avoided) ??
        takeBest(ledger, request.task, size, avoided, related) ??
        (request.share === true ? takeShared(ledger, request.task, size, avoided, related, request.shareOn) : undefined)
      if (executor === undefined) {
        return Either.left(shortfall(ledger, request, size, avoided, request.executors - placedOfRequest, placed))
      }
      placed.push(executor)
    }
  }
  return Either.right(placed)
}

/** A running executor some task could give up: its devices go back to the pool once it drains. */
export interface GivableExecutor {
  readonly task: string
  readonly id: string
  readonly node: string
  readonly devices: ReadonlyArray<string>
}

/**
 * Which executors to give up so that `request` places one executor: at most one from each list of
 * `offers` (a list per executor a donor was asked for, its preferred first), all on one node, and
 * the fewest that do it. `[]` when the request fits already; undefined when no choice makes it
 * fit, so that nothing is given up for nothing (an executor of two devices needs both on one node:
 * a device freed on another node does not help it).
 */
export const executorsToGive = (
  nodes: ReadonlyArray<PlacementNode>,
  holdings: ReadonlyArray<Holding>,
  offers: ReadonlyArray<ReadonlyArray<GivableExecutor>>,
  request: PlacementRequest
): ReadonlyArray<GivableExecutor> | undefined => {
  const one = { ...request, executors: 1 }
  const fits = (left: ReadonlyArray<Holding>) => Either.isRight(place(nodes, left, [one]))
  if (fits(holdings)) return []
  // The fewest executors; between as few, those their donors would give first (lowest ranks).
  let best: { readonly given: ReadonlyArray<GivableExecutor>; readonly rank: number } | undefined
  for (const node of nodes) {
    if (node.state !== "ready") continue
    const chosen: Array<GivableExecutor> = []
    let rank = 0
    let left = holdings
    for (const offer of offers) {
      if (best !== undefined && chosen.length >= best.given.length) break
      const index = offer.findIndex(
        (candidate) =>
          candidate.node === node.name &&
          !chosen.some((other) => other.task === candidate.task && other.id === candidate.id)
      )
      if (index < 0) continue
      const executor = offer[index]!
      chosen.push(executor)
      rank += index
      left = left.filter(
        (holding) =>
          holding.task !== executor.task || holding.node !== executor.node || !executor.devices.includes(holding.device)
      )
      if (fits(left)) {
        if (best === undefined || chosen.length < best.given.length || rank < best.rank)
          best = { given: [...chosen], rank }
        break
      }
    }
  }
  return best?.given
}

interface Ledger {
  /** Ready nodes' free devices in the node's order, in the order the nodes were given. */
  readonly free: Map<string, Array<Device>>
  /** Ready nodes' devices, in the node's order. */
  readonly all: Map<string, ReadonlyArray<Device>>
  readonly total: Map<string, number>
  /** Devices each task holds per ready node. */
  readonly usage: Map<string, Map<string, number>>
  /** The tasks holding each device, per ready node. */
  readonly holders: Map<string, Map<string, Set<string>>>
}

const heldDevices = (holdings: ReadonlyArray<Holding>): Map<string, Set<string>> => {
  const held = new Map<string, Set<string>>()
  for (const holding of holdings) {
    const onNode = held.get(holding.node) ?? new Set<string>()
    onNode.add(holding.device)
    held.set(holding.node, onNode)
  }
  return held
}

const makeLedger = (nodes: ReadonlyArray<PlacementNode>, holdings: ReadonlyArray<Holding>): Ledger => {
  const free = new Map<string, Array<Device>>()
  const all = new Map<string, ReadonlyArray<Device>>()
  const total = new Map<string, number>()
  const usage = new Map<string, Map<string, number>>()
  const holders = new Map<string, Map<string, Set<string>>>()
  for (const [name, devices] of freeDevices(nodes, holdings)) {
    const nodeDevices = nodes.find((node) => node.name === name)!.devices
    free.set(name, [...devices])
    all.set(name, nodeDevices)
    total.set(name, nodeDevices.length)
    usage.set(name, new Map())
    holders.set(name, new Map())
  }
  for (const holding of holdings) {
    const onNode = holders.get(holding.node)
    if (onNode === undefined) continue
    const tasks = onNode.get(holding.device) ?? new Set<string>()
    onNode.set(holding.device, tasks)
    if (tasks.has(holding.task)) continue
    tasks.add(holding.task)
    const used = usage.get(holding.node)!
    used.set(holding.task, (used.get(holding.task) ?? 0) + 1)
  }
  return { free, all, total, usage, holders }
}

/** The executors on a device of a node, before this one. */
const sharersOf = (ledger: Ledger, node: string, device: string) => ledger.holders.get(node)?.get(device)?.size ?? 0

/** Threads per device for an executor about to take `devices`: the smallest share among them. */
const threadsOn = (ledger: Ledger, node: string, devices: ReadonlyArray<Device>) =>
  Math.min(
    ...devices.map((device) => Math.max(1, Math.floor(device.threads / (sharersOf(ledger, node, device.id) + 1))))
  )

/** Takes `devices` for an executor of `task`, answering its threads per device. */
const take = (ledger: Ledger, node: string, devices: ReadonlyArray<Device>, task: string): number => {
  const threads = threadsOn(ledger, node, devices)
  const taken = new Set(devices.map((device) => device.id))
  ledger.free.set(
    node,
    ledger.free.get(node)!.filter((device) => !taken.has(device.id))
  )
  const onNode = ledger.usage.get(node)!
  onNode.set(task, (onNode.get(task) ?? 0) + devices.length)
  const held = ledger.holders.get(node)!
  for (const device of devices) {
    const tasks = held.get(device.id) ?? new Set<string>()
    tasks.add(task)
    held.set(device.id, tasks)
  }
  return threads
}

/** Relatedness both ways: a task listed as related by another request in the call is related back. */
const relations = (requests: ReadonlyArray<PlacementRequest>): Map<string, Set<string>> => {
  const relatedOf = new Map<string, Set<string>>()
  const relate = (task: string, other: string) => {
    if (task === other) return
    const set = relatedOf.get(task) ?? new Set<string>()
    set.add(other)
    relatedOf.set(task, set)
  }
  for (const request of requests) {
    for (const other of request.related) {
      relate(request.task, other)
      relate(other, request.task)
    }
  }
  return relatedOf
}

const takePreferred = (
  ledger: Ledger,
  request: PlacementRequest,
  size: number,
  avoided: ReadonlySet<string>
): PlacedExecutor | undefined => {
  for (const group of request.preferred ?? []) {
    const free = ledger.free.get(group.node)
    if (free === undefined || avoided.has(group.node) || group.devices.length !== size) continue
    if (new Set(group.devices).size !== size) continue
    const devices = group.devices.map((id) => free.find((device) => device.id === id))
    if (devices.some((device) => device === undefined)) continue
    const chosen = devices as ReadonlyArray<Device>
    const threads = take(ledger, group.node, chosen, request.task)
    return { task: request.task, node: group.node, devices: chosen, threads, reason: "kept: already runs there" }
  }
  return undefined
}

interface Candidate {
  readonly node: string
  readonly free: number
  readonly own: number
  readonly affinity: number
  readonly closest: string | undefined
}

const byNodeName = (a: { readonly node: string }, b: { readonly node: string }) =>
  a.node < b.node ? -1 : a.node > b.node ? 1 : 0

const bySpread = (a: Candidate, b: Candidate) => b.free - a.free || a.own - b.own || byNodeName(a, b)

const takeBest = (
  ledger: Ledger,
  task: string,
  size: number,
  avoided: ReadonlySet<string>,
  related: ReadonlySet<string>
): PlacedExecutor | undefined => {
  const candidates: Array<Candidate> = []
  for (const [node, free] of ledger.free) {
    if (avoided.has(node) || free.length < size) continue
    const own = ledger.usage.get(node)!.get(task) ?? 0
    candidates.push({ node, free: free.length, own, ...affinityOn(ledger, node, related) })
  }
  candidates.sort((a, b) => b.affinity - a.affinity || bySpread(a, b))
  const [chosen, runnerUp] = candidates
  if (chosen === undefined) return undefined
  const devices = ledger.free.get(chosen.node)!.slice(0, size)
  const threads = take(ledger, chosen.node, devices, task)
  return { task, node: chosen.node, devices, threads, reason: spreadReason(chosen, runnerUp) }
}

/** Devices related tasks hold on a node, and the one of them that holds the most. */
const affinityOn = (ledger: Ledger, node: string, related: ReadonlySet<string>) => {
  const onNode = ledger.usage.get(node)!
  let affinity = 0
  let closest: string | undefined
  let closestDevices = 0
  for (const other of related) {
    const devices = onNode.get(other) ?? 0
    affinity += devices
    if (devices > closestDevices) {
      closest = other
      closestDevices = devices
    }
  }
  return { affinity, closest }
}

/**
 * An executor on CPU devices that other tasks hold, when no node has enough free ones: on each
 * node, its free CPU devices first, then those with the fewest executors on them, never one this
 * task holds. The node: where related tasks hold the most devices, then the least shared choice,
 * then the fewest of this task's executors, then by name.
 */
const takeShared = (
  ledger: Ledger,
  task: string,
  size: number,
  avoided: ReadonlySet<string>,
  related: ReadonlySet<string>,
  only?: PlacementRequest["shareOn"]
): PlacedExecutor | undefined => {
  const candidates: Array<{
    readonly node: string
    readonly devices: ReadonlyArray<Device>
    readonly sharers: number
    readonly own: number
    readonly affinity: number
  }> = []
  for (const [node, devices] of ledger.all) {
    if (avoided.has(node) || (only !== undefined && only.node !== node)) continue
    const held = ledger.holders.get(node)!
    const open = devices
      .filter(
        (device) =>
          device.type === "cpu" &&
          !(held.get(device.id)?.has(task) ?? false) &&
          (only === undefined || only.devices.includes(device.id))
      )
      .map((device, order) => ({ device, order, sharers: held.get(device.id)?.size ?? 0 }))
      .sort((a, b) => a.sharers - b.sharers || a.order - b.order)
      .slice(0, size)
    if (open.length < size) continue
    candidates.push({
      node,
      devices: open.sort((a, b) => a.order - b.order).map((entry) => entry.device),
      sharers: open.reduce((sum, entry) => sum + entry.sharers, 0),
      own: ledger.usage.get(node)!.get(task) ?? 0,
      affinity: affinityOn(ledger, node, related).affinity
    })
  }
  candidates.sort((a, b) => b.affinity - a.affinity || a.sharers - b.sharers || a.own - b.own || byNodeName(a, b))
  const chosen = candidates[0]
  if (chosen === undefined) return undefined
  const held = ledger.holders.get(chosen.node)!
  const sharing = chosen.devices
    .filter((device) => (held.get(device.id)?.size ?? 0) > 0)
    .map((device) => `${device.id} with ${[...held.get(device.id)!].join(", ")}`)
  const threads = take(ledger, chosen.node, chosen.devices, task)
  const reason = `shares ${sharing.join("; ")} (no free device)`
  return { task, node: chosen.node, devices: chosen.devices, threads, reason }
}

const spreadReason = (chosen: Candidate, runnerUp: Candidate | undefined): string => {
  if (chosen.closest !== undefined) return `with related task ${chosen.closest}`
  if (runnerUp === undefined) return "only node with room"
  if (chosen.free === runnerUp.free && chosen.own < runnerUp.own) return "fewest executors of this task"
  return "most free devices"
}

const placedDevices = (placed: ReadonlyArray<PlacedExecutor>) =>
  placed.reduce((sum, executor) => sum + executor.devices.length, 0)

const shortfall = (
  ledger: Ledger,
  request: PlacementRequest,
  size: number,
  avoided: ReadonlySet<string>,
  unplaced: number,
  placed: ReadonlyArray<PlacedExecutor>
): PlacementShortfall => {
  // Free devices this request already took in the call count as free again: the whole call is
  // undone. Those it took to share were not free (their other holders keep them).
  const ownThisCall = new Map<string, number>()
  for (const executor of placed) {
    if (executor.task !== request.task) continue
    const wasFree = executor.devices.filter((device) => sharersOf(ledger, executor.node, device.id) === 1).length
    ownThisCall.set(executor.node, (ownThisCall.get(executor.node) ?? 0) + wasFree)
  }
  const takenByEarlier = placedDevices(placed.filter((executor) => executor.task !== request.task))
  const room: Array<NodeRoom> = [...ledger.free].map(([node, free]) => ({
    node,
    free: free.length + (ownThisCall.get(node) ?? 0),
    total: ledger.total.get(node)!,
    avoided: avoided.has(node)
  }))
  const rooms =
    room.length === 0
      ? "no ready node"
      : room
          .map((entry) => `${entry.node} ${entry.free} of ${entry.total}${entry.avoided ? " (avoided)" : ""}`)
          .join(", ")
  const earlier = takenByEarlier === 0 ? "" : `; tasks placed with it take ${takenByEarlier} device(s)`
  return {
    _tag: "PlacementShortfall",
    task: request.task,
    devicesPerExecutor: size,
    executors: request.executors,
    unplaced,
    room,
    takenByEarlier,
    message: `task ${request.task} needs ${size} device(s) per executor, ${request.executors} executor(s); free: ${rooms} (${unplaced} executor(s) short)${earlier}${request.share === true ? "; CPU devices held by other tasks were open to it, one executor of a task per device" : ""}`
  }
}
