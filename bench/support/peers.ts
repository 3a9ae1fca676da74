/**
 * The processes of bench/support/sidecar-peer.ts, driven over IPC, and the measurements made with
 * them: a hand-off from a sidecar client to a receiving executor process, and the same bytes over
 * raw TCP between two Node processes. Shared by the sidecar and cluster benches.
 */
import { type ChildProcess, fork } from "node:child_process"
import { bundleScript } from "../../test/support/bundle.js"
import type { SidecarClient } from "../../src/sidecar/SidecarClient.js"
import type { Tensor } from "../../src/sidecar/Tensor.js"

const PEER_SOURCE = "bench/support/sidecar-peer.ts"

/** Nanoseconds on the monotonic clock, which every process on the machine shares. */
export const now = () => process.hrtime.bigint()

/** Every peer process running; a bench's signal handler ends them. */
export const children = new Set<ChildProcess>()

/** Bundles sidecar-peer.ts for `fork`; the caller removes the file. */
export function bundlePeer(): Promise<string> {
  return bundleScript(PEER_SOURCE, `bench/.out/sidecar-peer-${process.pid}.mjs`)
}

/** A sidecar-peer.ts process in `role`, and its stream of IPC messages. */
export async function forkPeer(script: string, role: string, ...args: Array<string>) {
  const child = fork(script, [role, ...args], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
  children.add(child)
  child.once("exit", () => children.delete(child))
  const inbox: Array<Record<string, unknown>> = []
  const waiting: Array<{ resolve: (message: Record<string, unknown>) => void; reject: (error: Error) => void }> = []
  child.on("message", (message: Record<string, unknown>) => {
    const next = waiting.shift()
    if (next === undefined) inbox.push(message)
    else next.resolve(message)
  })
  child.once("exit", (code) => {
    for (const next of waiting.splice(0)) next.reject(new Error(`${role} exited (${code})`))
  })
  /** The next message from the child. */
  const receive = () =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const queued = inbox.shift()
      if (queued !== undefined) resolve(queued)
      else waiting.push({ resolve, reject })
    })
  return { child, send: (message: unknown) => child.send(message as object), receive, first: await receive() }
}

export type Peer = Awaited<ReturnType<typeof forkPeer>>

/** One hand-off to the receiving process: ns from `send` until it holds the view. */
export async function handOff(
  sender: SidecarClient,
  receiver: Peer,
  to: string,
  id: string,
  data: Tensor
): Promise<number> {
  receiver.send({ id, chunks: 1 })
  await receiver.receive()
  const started = now()
  await sender.send(id, data, { to: [to] })
  const { doneAt } = await receiver.receive()
  return Number(BigInt(doneAt as string) - started)
}

export type TcpRead = "data" | "onread"

/** ns for `bytes` over one new TCP connection from `source` to `sink`, read one of two ways. */
export async function rawTcpNs(source: Peer, sink: Peer, mode: TcpRead, bytes: number): Promise<number> {
  const started = now()
  sink.send({ port: source.first.port, mode })
  const { doneAt, bytes: received } = await sink.receive()
  if (received !== bytes) throw new Error(`raw TCP moved ${received} bytes, not ${bytes}`)
  return Number(BigInt(doneAt as string) - started)
}
