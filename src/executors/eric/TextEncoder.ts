import * as ort from "onnxruntime-node"
import type { Dtype } from "../../models/Dtype.js"
import { floatsOf } from "../../models/Float16.js"
import { InvalidModelDirectory, type ModelDirectory } from "../../models/ModelDirectory.js"
import { type Pooling, textEmbeddingFile } from "../../models/TextEmbedding.js"
import { createSession } from "../common/Sessions.js"
import { normalizeInPlace, paddedRuns, poolRow } from "./TextPooling.js"

/**
 * A text embedding model's graph on one device (onnx/model*.onnx → last_hidden_state): an
 * encoder (BERT: input_ids, attention_mask, token_type_ids) or a decoder exported for
 * feature extraction (Qwen3-Embedding: input_ids, attention_mask, position_ids and an empty
 * past_key_values.N.key/value). A batch's inputs of different lengths run right-padded in runs of
 * similar length; each input's tokens see only themselves, so its vector is the one it has alone.
 */

/** What the router attaches to each text input. */
export interface TextItemMeta {
  readonly modality: "text"
  readonly pooling: Pooling
  readonly normalize: boolean
}

/** At most this many positions (rows × padded length) in one run of the graph. */
const maxRunTokens = 8192

const pastPattern = /^(?:past_key_values|past)\.(\d+)\.(key|value)$/
const hiddenOutputs = ["last_hidden_state", "token_embeddings"]
const knownInputs = new Set(["input_ids", "attention_mask", "token_type_ids", "position_ids", "use_cache_branch"])

interface GraphInput {
  readonly name: string
  readonly type: string
  readonly shape: ReadonlyArray<number | string>
}

const metadataOf = (values: ReadonlyArray<ort.InferenceSession.ValueMetadata>): Array<GraphInput> =>
  values.flatMap((value) => (value.isTensor ? [{ name: value.name, type: value.type, shape: value.shape }] : []))

const integers = (type: string, values: ArrayLike<number>, dims: ReadonlyArray<number>): ort.Tensor =>
  type === "int32"
    ? new ort.Tensor("int32", Int32Array.from(values), [...dims])
    : new ort.Tensor("int64", BigInt64Array.from(Array.from(values, BigInt)), [...dims])

interface CacheInput {
  readonly input: GraphInput
  readonly heads: number
  readonly dim: number
}

/** What the graph takes and answers, checked: a graph that is no embedding export is refused with the reason. */
const graphInterface = (
  session: ort.InferenceSession,
  model: ModelDirectory
): {
  readonly inputs: ReadonlyArray<GraphInput>
  readonly output: string
  readonly pasts: ReadonlyArray<CacheInput>
} => {
  const inputs = metadataOf(session.inputMetadata)
  const outputs = metadataOf(session.outputMetadata).map((value) => value.name)
  const output = hiddenOutputs.find((name) => outputs.includes(name))
  if (output === undefined) {
    throw new Error(
      `it answers ${outputs.join(", ")}, not last_hidden_state: it is not exported for feature extraction`
    )
  }
  if (!inputs.some((input) => input.name === "input_ids")) throw new Error("it takes no input_ids")
  const pasts: Array<CacheInput> = []
  for (const input of inputs) {
    if (pastPattern.test(input.name)) {
      const [, shapeHeads, , shapeDim] = input.shape
      const heads = typeof shapeHeads === "number" ? shapeHeads : model.decoder?.keyValueHeads
      const dim = typeof shapeDim === "number" ? shapeDim : model.decoder?.headDim
      if (heads === undefined || dim === undefined) throw new Error(`the shape of ${input.name} is not known`)
      pasts.push({ input, heads, dim })
    } else if (!knownInputs.has(input.name)) {
      throw new Error(`its input ${input.name} is not one the platform knows how to fill`)
    }
  }
  return { inputs, output, pasts }
}

export class TextEncoder {
  private constructor(
    private readonly session: ort.InferenceSession,
    private readonly inputs: ReadonlyArray<GraphInput>,
    private readonly output: string,
    /** Each cache input's [kvHeads, headDim], for an empty past. */
    private readonly pasts: ReadonlyArray<CacheInput>,
    readonly file: string
  ) {}

  /** Opens onnx/model*.onnx at `dtype` (by default fp32, or the closest there is), checking what it takes and answers. */
  static async open(model: ModelDirectory, device: string, threads: number, dtype?: Dtype): Promise<TextEncoder> {
    const { path } = textEmbeddingFile(model, dtype)
    const file = path.slice(model.path.length + 1)
    const session = await createSession(path, device, threads)
    try {
      const { inputs, output, pasts } = graphInterface(session, model)
      return new TextEncoder(session, inputs, output, pasts, file)
    } catch (reason) {
      await session.release()
      throw new InvalidModelDirectory({ path: model.path, reason: `${file}: ${(reason as Error).message}` })
    }
  }

  /**
   * The vectors of the inputs whose token ids lie in `tokens` at `rows` (each its [from, to)),
   * pooled and normalized as each asks.
   */
  async embed(
    tokens: ArrayLike<number>,
    items: ReadonlyArray<{ readonly rows: readonly [number, number]; readonly meta: TextItemMeta }>
  ): Promise<Array<Float32Array>> {
    const vectors = new Array<Float32Array>(items.length)
    const lengths = items.map(({ rows: [from, to] }) => to - from)
    for (const run of paddedRuns(lengths, maxRunTokens)) {
      const width = lengths[run[0]!]!
      const hidden = await this.run(
        run.map((index) => items[index]!.rows),
        tokens,
        width
      )
      const size = hidden.data.length / (run.length * width)
      run.forEach((index, row) => {
        const { meta } = items[index]!
        const vector = poolRow(hidden.data, width, size, row, lengths[index]!, meta.pooling)
        vectors[index] = meta.normalize ? normalizeInPlace(vector) : vector
      })
    }
    return vectors
  }

  release(): Promise<void> {
    return this.session.release()
  }

  /** One run: the rows right-padded to `width`; answers last_hidden_state [rows, width, hidden] as float32. */
  private async run(
    rows: ReadonlyArray<readonly [number, number]>,
    tokens: ArrayLike<number>,
    width: number
  ): Promise<{ readonly data: ArrayLike<number> }> {
    const batch = rows.length
    const ids = new Array<number>(batch * width).fill(0)
    const mask = new Array<number>(batch * width).fill(0)
    const positions = new Array<number>(batch * width).fill(0)
    rows.forEach(([from, to], row) => {
      for (let position = 0; position < to - from; position++) {
        ids[row * width + position] = tokens[from + position]!
        mask[row * width + position] = 1
        positions[row * width + position] = position
      }
    })
    const dims = [batch, width]
    const feeds: Record<string, ort.Tensor> = {}
    for (const input of this.inputs) {
      switch (input.name) {
        case "input_ids":
          feeds[input.name] = integers(input.type, ids, dims)
          break
        case "attention_mask":
          feeds[input.name] = integers(input.type, mask, dims)
          break
        case "token_type_ids":
          feeds[input.name] = integers(input.type, new Array<number>(batch * width).fill(0), dims)
          break
        case "position_ids":
          feeds[input.name] = integers(input.type, positions, dims)
          break
        case "use_cache_branch":
          feeds[input.name] = new ort.Tensor("bool", Uint8Array.of(0), [1])
          break
      }
    }
    for (const { input, heads, dim } of this.pasts) {
      feeds[input.name] =
        input.type === "float16"
          ? new ort.Tensor("float16", new Uint16Array(0), [batch, heads, 0, dim])
          : new ort.Tensor("float32", new Float32Array(0), [batch, heads, 0, dim])
    }
    const outputs = await this.session.run(feeds, [this.output])
    const hidden = outputs[this.output]!
    const data = hidden.type === "float16" ? floatsOf(hidden.data as Uint16Array) : (hidden.data as Float32Array)
    return { data }
  }
}
