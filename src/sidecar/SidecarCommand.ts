import { join } from "node:path"
import * as Console from "effect/Console"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as ParseResult from "effect/ParseResult"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { freshSecret } from "../contracts/Credentials.js"
import { exitWithParent } from "../process/Lifeline.js"
import { traceProcess } from "../tracing/Tracing.js"
import { Arena, arenaFilePrefix } from "./Arena.js"
import { internalSecretEnvName, takeInternalSecret } from "./InternalSecret.js"
import { parsePeers, PeerTransport } from "./PeerTransport.js"
import { makeSidecarLog } from "./SidecarLog.js"
import { formatReadyLine } from "./SidecarProcess.js"
import { SidecarServer } from "./SidecarServer.js"
import { SizeClassAllocator } from "./SizeClassAllocator.js"
import { SlotPool } from "./SlotPool.js"
import { TransferTable } from "./TransferTable.js"

/**
 * `cornserve internal sidecar`: the process that owns a node's arena and its peer port. The node
 * agent starts one per node and stops it with SIGTERM; it also stops by itself when the process
 * that started it is gone, and in every case it removes its /dev/shm file on the way out. Its peers
 * prove the internal secret it finds in its environment (CORNSERVE_INTERNAL_SECRET); started
 * without one, it makes its own, which no peer can prove: it then serves its own node only.
 */

export const SidecarOptions = Schema.Struct({
  nodeId: Schema.String.pipe(
    Schema.pattern(/^[A-Za-z0-9._-]{1,64}$/, { message: () => "a node id is 1 to 64 letters, digits, '.', '_' or '-'" })
  ),
  socketPath: Schema.String.pipe(Schema.minLength(1)),
  /** Default: /dev/shm/cornserve-arena-<node id>-<pid>. */
  arenaPath: Schema.optional(Schema.String.pipe(Schema.minLength(1))),
  arenaBytes: Schema.Int.pipe(Schema.greaterThanOrEqualTo(1024 * 1024)),
  peerHost: Schema.String.pipe(Schema.minLength(1)),
  peerPort: Schema.Int.pipe(Schema.between(0, 65535)),
  /** node-id=host:port, comma-separated. */
  peers: Schema.String,
  ttlMs: Schema.Number.pipe(Schema.positive()),
  peerTimeoutMs: Schema.Number.pipe(Schema.positive())
})
export type SidecarOptions = typeof SidecarOptions.Type

/** How often unconsumed chunks are looked for, at most. */
const maxSweepIntervalMs = 1000

export class InvalidSidecarOptions extends Schema.TaggedError<InvalidSidecarOptions>()("InvalidSidecarOptions", {
  reason: Schema.String
}) {
  override get message() {
    return `invalid sidecar options: ${this.reason}`
  }
}

const invalid = (reason: string) => new InvalidSidecarOptions({ reason })

const decodeOptions = (input: SidecarOptions) =>
  Schema.decodeUnknown(SidecarOptions)(input).pipe(
    Effect.mapError((error) =>
      invalid(
        ParseResult.ArrayFormatter.formatErrorSync(error)
          .map((issue) => `${issue.path.join(".")}: ${issue.message}`)
          .join("; ")
      )
    )
  )

/** Runs until SIGTERM/SIGINT (which interrupt it), which it also sends itself once its parent is gone. */
export const runSidecar = Effect.fn("Sidecar.run")(function* (input: SidecarOptions) {
  const options = yield* decodeOptions(input)
  yield* Effect.zipRight(traceProcess("sidecar", { "cornserve.node": options.nodeId }), serve(options)).pipe(
    Effect.scoped,
    Effect.annotateLogs("sidecar", options.nodeId)
  )
})

const serve = (options: SidecarOptions) =>
  Effect.gen(function* () {
    exitWithParent()
    const peers = yield* Effect.try({
      try: () => parsePeers(options.peers),
      catch: (error) => invalid((error as Error).message)
    })
    const log = yield* makeSidecarLog
    const given = takeInternalSecret()
    if (given === undefined) log.info(`no ${internalSecretEnvName} in the environment: no peer can connect`)
    const arenaPath = options.arenaPath ?? join("/dev/shm", `${arenaFilePrefix}${options.nodeId}-${process.pid}`)
    const arena = yield* Arena.create(arenaPath, options.arenaBytes)
    const slots = new SlotPool(
      options.nodeId,
      new SizeClassAllocator(arena.byteLength, { maxBlockBytes: arena.segmentBytes }),
      (offset, bytes) => arena.commit(offset, bytes)
    )
    const table = new TransferTable(slots, options.ttlMs, log.warn)
    const transport = yield* PeerTransport.start({
      nodeId: options.nodeId,
      host: options.peerHost,
      port: options.peerPort,
      peers,
      linkTimeoutMs: options.peerTimeoutMs,
      arena,
      slots,
      table,
      log,
      secret: given ?? freshSecret()
    })
    yield* SidecarServer.listen({
      nodeId: options.nodeId,
      socketPath: options.socketPath,
      arena,
      slots,
      table,
      peers: transport,
      log
    })
    yield* Effect.sync(() => table.sweep(Date.now())).pipe(
      Effect.repeat(Schedule.spaced(Duration.millis(Math.min(options.ttlMs / 2, maxSweepIntervalMs)))),
      Effect.forkScoped
    )
    yield* Console.log(
      formatReadyLine({
        nodeId: options.nodeId,
        socketPath: options.socketPath,
        peerPort: transport.port,
        arenaPath,
        arenaBytes: arena.byteLength
      })
    )
    return yield* Effect.never
  })
