import * as Schema from "effect/Schema"

/**
 * What can go wrong in a tensor transfer. Each is a Schema class so that the sidecar can send it
 * over its socket and the client rethrows the same class, with the fields a caller needs.
 */

const formatBytes = (bytes: number) => {
  if (bytes >= 2 ** 30) return `${(bytes / 2 ** 30).toFixed(2)} GiB`
  if (bytes >= 2 ** 20) return `${(bytes / 2 ** 20).toFixed(2)} MiB`
  if (bytes >= 2 ** 10) return `${(bytes / 2 ** 10).toFixed(2)} KiB`
  return `${bytes} B`
}

export class ArenaUnavailable extends Schema.TaggedError<ArenaUnavailable>()("ArenaUnavailable", {
  path: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `the arena ${this.path} cannot be used: ${this.reason}`
  }
}

export class SidecarUnavailable extends Schema.TaggedError<SidecarUnavailable>()("SidecarUnavailable", {
  socketPath: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `the sidecar at ${this.socketPath} is unavailable: ${this.reason}`
  }
}

export class AllocationTimeout extends Schema.TaggedError<AllocationTimeout>()("AllocationTimeout", {
  nodeId: Schema.String,
  bytes: Schema.Number,
  waitedMs: Schema.Number,
  usedBytes: Schema.Number,
  capacityBytes: Schema.Number
}) {
  override get message() {
    return (
      `no room for ${formatBytes(this.bytes)} in the arena of node ${this.nodeId} within ${this.waitedMs} ms ` +
      `(${formatBytes(this.usedBytes)} of ${formatBytes(this.capacityBytes)} hold data not marked done yet): ` +
      `receivers must markDone what they have read, or the sidecar needs a larger --arena-bytes`
    )
  }
}

export class TensorTooLarge extends Schema.TaggedError<TensorTooLarge>()("TensorTooLarge", {
  nodeId: Schema.String,
  bytes: Schema.Number,
  largestBytes: Schema.Number
}) {
  override get message() {
    return `${formatBytes(this.bytes)} can never fit in the arena of node ${this.nodeId}: its largest slot is ${formatBytes(this.largestBytes)}`
  }
}

export class RecvTimeout extends Schema.TaggedError<RecvTimeout>()("RecvTimeout", {
  id: Schema.String,
  chunk: Schema.Number,
  waitedMs: Schema.Number
}) {
  override get message() {
    return `chunk ${this.chunk} of transfer "${this.id}" did not arrive within ${this.waitedMs} ms`
  }
}

export class UnknownNode extends Schema.TaggedError<UnknownNode>()("UnknownNode", {
  nodeId: Schema.String,
  known: Schema.Array(Schema.String)
}) {
  override get message() {
    return `no sidecar is known for node "${this.nodeId}" (known: ${this.known.join(", ")})`
  }
}

export class PeerUnavailable extends Schema.TaggedError<PeerUnavailable>()("PeerUnavailable", {
  nodeId: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `the sidecar of node "${this.nodeId}" is unavailable: ${this.reason}`
  }
}

export class DuplicateChunk extends Schema.TaggedError<DuplicateChunk>()("DuplicateChunk", {
  id: Schema.String,
  chunk: Schema.Number
}) {
  override get message() {
    return `chunk ${this.chunk} of transfer "${this.id}" was already sent`
  }
}

export class InvalidRequest extends Schema.TaggedError<InvalidRequest>()("InvalidRequest", {
  reason: Schema.String
}) {
  override get message() {
    return `invalid sidecar request: ${this.reason}`
  }
}

/** A fault of the sidecar itself, reported rather than crashing it. */
export class SidecarInternalError extends Schema.TaggedError<SidecarInternalError>()("SidecarInternalError", {
  reason: Schema.String
}) {
  override get message() {
    return `sidecar fault: ${this.reason}`
  }
}

export const SidecarError = Schema.Union(
  ArenaUnavailable,
  SidecarUnavailable,
  AllocationTimeout,
  TensorTooLarge,
  RecvTimeout,
  UnknownNode,
  PeerUnavailable,
  DuplicateChunk,
  InvalidRequest,
  SidecarInternalError
)
export type SidecarError = typeof SidecarError.Type

const isSidecarError = Schema.is(SidecarError)

/** The error to report for a failure: itself when it is one of the above. */
export const toSidecarError = (error: unknown): SidecarError =>
  isSidecarError(error)
    ? error
    : new SidecarInternalError({ reason: error instanceof Error ? (error.stack ?? error.message) : String(error) })
