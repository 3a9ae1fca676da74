import { randomUUID } from "node:crypto"

/** The kinds of data that travel between executors through the sidecar rather than through the app. */
export type ForwardedDataType = "Tensor" | "bytes" | "string" | "number" | "boolean" | "json"

const marker = "$dataForward"

export interface EncodedDataForward {
  readonly [marker]: string
  readonly dataType: ForwardedDataType
}

/**
 * A handle on data that one task produces and another consumes. The app only ever holds the handle;
 * the dispatcher wires the producer's executor to the consumers' executors and the bytes go
 * executor → sidecar → executor.
 */
export class DataForward<T extends ForwardedDataType = "Tensor"> {
  readonly id: string

  constructor(
    readonly dataType: T,
    id?: string
  ) {
    this.id = id ?? randomUUID().replaceAll("-", "")
  }

  toJSON(): EncodedDataForward {
    return { [marker]: this.id, dataType: this.dataType }
  }

  static isEncoded(value: unknown): value is EncodedDataForward {
    return typeof value === "object" && value !== null && typeof (value as Record<string, unknown>)[marker] === "string"
  }

  static decode(value: EncodedDataForward): DataForward<ForwardedDataType> {
    return new DataForward(value.dataType, value[marker])
  }
}

/** Every DataForward reachable from a value (arrays, plain objects), in document order. */
export const collectDataForwards = (
  value: unknown,
  into: Array<DataForward<ForwardedDataType> | EncodedDataForward> = []
) => {
  if (value instanceof DataForward || DataForward.isEncoded(value)) {
    into.push(value)
  } else if (Array.isArray(value)) {
    for (const item of value) collectDataForwards(item, into)
  } else if (typeof value === "object" && value !== null && !ArrayBuffer.isView(value)) {
    for (const item of Object.values(value)) collectDataForwards(item, into)
  }
  return into
}

export const dataForwardId = (value: DataForward<ForwardedDataType> | EncodedDataForward): string =>
  value instanceof DataForward ? value.id : value[marker]

/** Turns encoded handles (from JSON) back into DataForward objects, everywhere in a value. */
export const reviveDataForwards = (value: unknown): unknown => {
  if (DataForward.isEncoded(value)) return DataForward.decode(value)
  if (Array.isArray(value)) return value.map(reviveDataForwards)
  if (typeof value === "object" && value !== null && Object.getPrototypeOf(value) === Object.prototype) {
    const out: Record<string, unknown> = {}
    for (const [key, item] of Object.entries(value)) out[key] = reviveDataForwards(item)
    return out
  }
  return value
}

/**
 * A copy of a value with every DataForward (object or encoded handle) renamed by `rename`, each in
 * the form it had; everything else is kept as it is.
 */
export const renameDataForwards = (value: unknown, rename: (id: string) => string): unknown => {
  if (value instanceof DataForward) return new DataForward(value.dataType, rename(value.id))
  if (DataForward.isEncoded(value)) return { ...value, [marker]: rename(value[marker]) }
  if (Array.isArray(value)) return value.map((item) => renameDataForwards(item, rename))
  if (typeof value === "object" && value !== null && Object.getPrototypeOf(value) === Object.prototype) {
    const out: Record<string, unknown> = {}
    for (const [key, item] of Object.entries(value)) out[key] = renameDataForwards(item, rename)
    return out
  }
  return value
}
