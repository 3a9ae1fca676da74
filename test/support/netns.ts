import { type ChildProcess, execFile, type SpawnOptions, spawn, spawnSync } from "node:child_process"
import { isRunning } from "../../src/node/AbandonedFiles.js"
import { trackGroup, trackLink, trackNamespace, untrackLink, untrackNamespace } from "./reaper/registry.js"

/**
 * A small virtual network on this machine for multi-node tests: one Linux network namespace per
 * node, all on one bridge, each node with its own IPv4 address, and the host (the test process's
 * own namespace) on the same bridge. A node's link can be cut and restored: a partition.
 *
 * The bridge lives in a namespace of its own (the hub), not in the host's: iptables and nftables
 * rules are per namespace, so with br_netfilter loaded (bridge-nf-call-iptables = 1) bridged
 * traffic meets the hub's empty ACCEPT chains and never the host's FORWARD policy. Nothing of
 * the host's firewall or sysctls is read or changed, so there is nothing to undo. The host joins
 * the bridge through one veth pair whose host end holds the bridge address (.1); IPv4 forwarding
 * is not needed on a flat bridge.
 *
 *   host ──veth── hub[bridge] ──veth── node 0 (eth0, .2)
 *                             ──veth── node 1 (eth0, .3) ...
 *
 * Every name starts with `cn<pid>x<k>` (k counts this process's networks), so a later run can tell
 * the leftovers of a process that is gone from those of one still running. Only the host end of
 * the uplink is an interface name in the host's namespace (15 characters at most); the others live
 * inside the hub and node namespaces. Needs root and `ip` (iproute2).
 */

export interface VirtualNode {
  /** The network namespace's name (`ip netns exec NAME ...`). */
  readonly name: string
  readonly address: string
}

export interface VirtualNetwork {
  /** The host's address on the bridge: the test process reaches every node from it. */
  readonly bridgeAddress: string
  readonly nodes: ReadonlyArray<VirtualNode>
  /**
   * Starts `command` inside a node's namespace ("root": in the test process's own), in a process
   * group of its own that `close` ends.
   */
  spawn(node: number | "root", command: string, args: ReadonlyArray<string>, options?: SpawnOptions): ChildProcess
  /** Takes a node's bridge port down: what it sends and what is sent to it is dropped, silently. */
  cut(node: number): Promise<void>
  /** Brings a cut node's bridge port back up. */
  restore(node: number): Promise<void>
  /** Ends what was spawned (whole process groups), then deletes the namespaces and links. Safe to call again. */
  close(): Promise<void>
}

const ipCommand = "ip"
const namePrefix = "cn"
const leftoverName = /^cn(\d+)x\d+(?:-|$)/
/** How long spawned processes get to stop after SIGTERM before their groups are killed. */
const stopGraceMs = 3_000

const ip = (args: ReadonlyArray<string>) =>
  new Promise<string>((resolve, reject) =>
    execFile(ipCommand, args, (error, stdout, stderr) =>
      error === null ? resolve(stdout) : reject(new Error(`ip ${args.join(" ")}: ${stderr.trim() || error.message}`))
    )
  )

/** Runs `ip` for a cleanup whose target may be gone already. */
const ipQuietly = (args: ReadonlyArray<string>) =>
  ip(args).then(
    () => undefined,
    () => undefined
  )

let available: boolean | undefined

/** Whether this process may build networks: it runs as root and `ip netns add` works. */
export const netnsAvailable = (): boolean => {
  if (available !== undefined) return available
  const probe = `${namePrefix}${process.pid}x-probe`
  available =
    process.getuid?.() === 0 &&
    spawnSync(ipCommand, ["netns", "add", probe], { stdio: "ignore" }).status === 0 &&
    spawnSync(ipCommand, ["netns", "del", probe], { stdio: "ignore" }).status === 0
  return available
}

const ownedByGoneProcess = (name: string) => {
  const pid = leftoverName.exec(name)?.[1]
  return pid !== undefined && !isRunning(Number(pid))
}

/** Removes the namespaces and host links of networks whose process no longer runs. */
const removeLeftovers = async () => {
  const namespaces = (await ip(["netns", "list"])).split("\n").map((line) => line.split(" ")[0]!)
  const links = (await ip(["-o", "link", "show"])).split("\n").map((line) => /^\d+: ([^@:]+)/.exec(line)?.[1] ?? "")
  await Promise.all([
    ...namespaces.filter(ownedByGoneProcess).map((name) => ipQuietly(["netns", "del", name])),
    ...links.filter(ownedByGoneProcess).map((name) => ipQuietly(["link", "del", name]))
  ])
}

const toInt = (address: string) => address.split(".").reduce((value, octet) => value * 256 + Number(octet), 0)

interface Prefix {
  readonly base: number
  readonly length: number
}

const parsePrefix = (text: string): Prefix => {
  const [address, length] = text.split("/")
  const bits = length === undefined ? 32 : Number(length)
  const size = 2 ** (32 - bits)
  return { base: Math.floor(toInt(address!) / size) * size, length: bits }
}

const overlaps = (a: Prefix, b: Prefix) => {
  const shorter = Math.min(a.length, b.length)
  const size = 2 ** (32 - shorter)
  return Math.floor(a.base / size) === Math.floor(b.base / size)
}

let networksMade = 0

/**
 * A 10.X.Y.0/24 that no address or route of the host's namespace overlaps (the networks of other
 * test processes included: each puts its bridge address there). The first one tried follows from
 * the pid, so that test files running side by side start far apart.
 */
const pickSubnet = async (): Promise<string> => {
  const addresses = [...(await ip(["-4", "-o", "addr", "show"])).matchAll(/inet (\S+)/g)].map((match) => match[1]!)
  const routes = (await ip(["-4", "route", "show", "table", "all"]))
    .split("\n")
    .map((line) => line.split(" ")[0]!)
    .filter((destination) => /^\d+\.\d+\.\d+\.\d+/.test(destination))
  const taken = [...addresses, ...routes].map(parsePrefix)
  const subnets = 254 * 256
  const first = (process.pid * 64 + networksMade) % subnets
  for (let attempt = 0; attempt < 256; attempt++) {
    const index = (first + attempt * 257) % subnets
    const subnet = `10.${1 + Math.floor(index / 256)}.${index % 256}`
    const candidate = parsePrefix(`${subnet}.0/24`)
    if (!taken.some((prefix) => overlaps(prefix, candidate))) return subnet
  }
  throw new Error("no free 10.X.Y.0/24 for a test network: the host's addresses and routes cover them all")
}

interface Spawned {
  readonly child: ChildProcess
  readonly exited: Promise<void>
}

/** Sends a signal (0: none, only the check) to a whole process group; false once the group is gone. */
const signalGroup = (pid: number, signal: NodeJS.Signals | 0) => {
  try {
    process.kill(-pid, signal)
    return true
  } catch {
    return false
  }
}

/** Builds a network of `nodes` namespaces; see the module comment for its shape. */
export const makeNetwork = async (options: { readonly nodes: number }): Promise<VirtualNetwork> => {
  await removeLeftovers()
  const tag = `${namePrefix}${process.pid}x${networksMade}`
  const subnet = await pickSubnet()
  networksMade++
  const hub = `${tag}-hub`
  const uplink = tag
  const nodes = Array.from({ length: options.nodes }, (_, index) => ({
    name: `${tag}-n${index}`,
    address: `${subnet}.${index + 2}`
  }))
  const bridgePort = (index: number) => `port${index}`
  const namespaces: Array<string> = []
  const spawned = new Set<Spawned>()

  const teardown = async () => {
    await Promise.all(
      [...spawned].map(async ({ child, exited }) => {
        if (child.pid === undefined) return
        if (!signalGroup(child.pid, "SIGTERM")) return
        const timer = new Promise((resolve) => setTimeout(resolve, stopGraceMs).unref())
        await Promise.race([exited, timer])
        signalGroup(child.pid, "SIGKILL")
        await exited
      })
    )
    // Deleting the hub takes its veth pairs, the uplink's included, with it; the uplink is
    // deleted by name as well, since a namespace is destroyed in the background.
    for (const name of namespaces.reverse()) {
      await ipQuietly(["netns", "del", name])
      untrackNamespace(name)
    }
    await ipQuietly(["link", "del", uplink])
    untrackLink(uplink)
    process.off("exit", teardownSync)
  }

  /** What is left when the test process exits without closing the network. */
  const teardownSync = () => {
    for (const { child } of spawned) if (child.pid !== undefined) signalGroup(child.pid, "SIGKILL")
    for (const name of namespaces) spawnSync(ipCommand, ["netns", "del", name], { stdio: "ignore" })
    spawnSync(ipCommand, ["link", "del", uplink], { stdio: "ignore" })
  }
  process.on("exit", teardownSync)

  const addNamespace = async (name: string) => {
    // Registered first: the test run's reaper deletes it if this worker is gone before `close`.
    trackNamespace(name)
    await ip(["netns", "add", name])
    namespaces.push(name)
    await ip(["-n", name, "link", "set", "lo", "up"])
  }

  try {
    await addNamespace(hub)
    await ip(["-n", hub, "link", "add", "bridge", "type", "bridge"])
    await ip(["-n", hub, "link", "set", "bridge", "up"])
    trackLink(uplink)
    await ip(["link", "add", uplink, "type", "veth", "peer", "name", "uplink", "netns", hub])
    await ip(["-n", hub, "link", "set", "uplink", "master", "bridge", "up"])
    await ip(["addr", "add", `${subnet}.1/24`, "dev", uplink])
    await ip(["link", "set", uplink, "up"])
    for (const [index, node] of nodes.entries()) {
      await addNamespace(node.name)
      await ip([
        "-n",
        hub,
        "link",
        "add",
        bridgePort(index),
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        node.name
      ])
      await ip(["-n", hub, "link", "set", bridgePort(index), "master", "bridge", "up"])
      await ip(["-n", node.name, "addr", "add", `${node.address}/24`, "dev", "eth0"])
      await ip(["-n", node.name, "link", "set", "eth0", "up"])
    }
  } catch (error) {
    await teardown()
    throw error
  }

  const nodeAt = (index: number) => {
    const node = nodes[index]
    if (node === undefined) throw new Error(`the network has ${nodes.length} nodes, not a node ${index}`)
    return node
  }

  let closing: Promise<void> | undefined
  return {
    bridgeAddress: `${subnet}.1`,
    nodes,
    spawn: (node, command, args, spawnOptions = {}) => {
      if (closing !== undefined) throw new Error("the network is closed")
      const child =
        node === "root"
          ? spawn(command, args, { ...spawnOptions, detached: true })
          : spawn(ipCommand, ["netns", "exec", nodeAt(node).name, command, ...args], {
              ...spawnOptions,
              detached: true
            })
      trackGroup(child)
      const entry: Spawned = {
        child,
        exited: new Promise((resolve) => {
          child.once("exit", () => resolve())
          child.once("error", () => resolve())
        })
      }
      spawned.add(entry)
      void entry.exited.then(() => {
        // Its group may outlive it (children it started); close still ends that.
        if (child.pid === undefined || !signalGroup(child.pid, 0)) spawned.delete(entry)
      })
      return child
    },
    cut: async (node) => {
      nodeAt(node)
      await ip(["-n", hub, "link", "set", bridgePort(node), "down"])
    },
    restore: async (node) => {
      nodeAt(node)
      await ip(["-n", hub, "link", "set", bridgePort(node), "up"])
    },
    close: () => {
      closing ??= teardown()
      return closing
    }
  }
}
