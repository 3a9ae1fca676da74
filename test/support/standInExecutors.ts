import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Effect } from "effect"
import { healthWatchPeriodMs } from "../../src/executors/common/Health.js"
import type { NodeHandle } from "../../src/control/cluster/NodeHandle.js"
import type { ExecutorGroup } from "../../src/control/task-manager/TaskManagers.js"
import type { Executor, ExecutorKind } from "../../src/control/task-manager/ExecutorKinds.js"
import { type Device, parseDevices } from "../../src/node/Devices.js"

/** One request a stand-in executor received: its path, its JSON body, and whether its client hung up early. */
export interface ReceivedRequest {
  readonly path: string
  readonly body: unknown
  readonly abandoned: Promise<boolean>
}

export type StandInHandler = (request: ReceivedRequest, response: Http.ServerResponse) => void

/**
 * A small HTTP server on 127.0.0.1 that speaks an executor's API as the test tells it: `/health` and
 * `/health/watch` report `health` (200, ready, unless changed), every POST goes to `handle`. While
 * `silent`, its health watch writes nothing (as an executor whose event loop does not run); the
 * reasons it was asked to restart for are in `restarts`.
 */
export class StandInExecutor {
  readonly received: Array<ReceivedRequest> = []
  readonly restarts: Array<string> = []
  health = 200
  silent = false
  handle: StandInHandler = (_, response) => response.writeHead(500).end()

  private constructor(
    private readonly server: Http.Server,
    readonly url: string
  ) {}

  static async start(): Promise<StandInExecutor> {
    const server = Http.createServer()
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    const standIn = new StandInExecutor(server, `http://127.0.0.1:${(server.address() as AddressInfo).port}`)
    server.on("request", (request, response) => standIn.serve(request, response))
    return standIn
  }

  private serve(request: Http.IncomingMessage, response: Http.ServerResponse) {
    if (request.url === "/health") return response.writeHead(this.health).end("{}")
    if (request.url === "/health/watch") return this.watchHealth(response)
    const chunks: Array<Buffer> = []
    request.on("data", (chunk: Buffer) => chunks.push(chunk))
    request.once("end", () => {
      const abandoned = new Promise<boolean>((resolve) =>
        response.once("close", () => resolve(!response.writableFinished))
      )
      const received = { path: request.url ?? "", body: JSON.parse(Buffer.concat(chunks).toString()), abandoned }
      this.received.push(received)
      this.handle(received, response)
    })
  }

  /**
   * Reports `health` at every look of a real executor's router, a line now and then one every watch
   * period; a router writes only the lines that change or go stale (`healthLines`), which the control
   * plane reads the same way.
   */
  private watchHealth(response: Http.ServerResponse) {
    const report = () => {
      if (!this.silent) response.write(`${JSON.stringify({ status: this.health === 200 ? "ready" : "starting" })}\n`)
    }
    response.writeHead(200, { "content-type": "application/x-ndjson" })
    report()
    const timer = setInterval(report, healthWatchPeriodMs)
    response.once("close", () => clearInterval(timer))
  }

  close(): Promise<void> {
    this.server.closeAllConnections()
    return new Promise((resolve) => this.server.close(() => resolve()))
  }
}

/** Answers `{ error: { code, message } }` with a status, as a real executor refuses. */
export const refuse = (response: Http.ServerResponse, status: number, code: string, message = code) =>
  response.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify({ error: { code, message } }))

export const answerJson = (response: Http.ServerResponse, body: unknown) =>
  response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(body))

/** An executor kind whose executors are the given stand-ins, one per device, in order. */
export const standInKind = (kind: string, standIns: ReadonlyArray<StandInExecutor>): ExecutorKind => {
  let next = 0
  return {
    kind,
    devicesPerExecutor: () => 1,
    start: (_, slot) =>
      Effect.sync((): Executor => {
        const standIn = standIns[next++]!
        return { devices: slot.devices, url: () => standIn.url, restart: (reason) => standIn.restarts.push(reason) }
      })
  }
}

export const cpuDevices = (count: number) =>
  parseDevices(Array.from({ length: count }, (_, index) => `cpu:${index}`).join(","))

/**
 * A node for stand-in kinds, which start their executors themselves: it is only named. Asked to
 * start a real executor, it refuses.
 */
export const namedNode = (name: string, devices: ReadonlyArray<Device>): NodeHandle => ({
  name,
  devices,
  prepareModel: () => Effect.void,
  startExecutor: () => Effect.fail(new Error(`node ${name} runs stand-in executors only`))
})

/** `count` executors of one cpu device each, on one node. */
export const cpuGroups = (count: number, node = "local"): ReadonlyArray<ExecutorGroup> => {
  const devices = cpuDevices(count)
  const handle = namedNode(node, devices)
  return devices.map((device) => ({ node: handle, devices: [device] }))
}
