/**
 * Opens an LLM's sessions as its decoder plan says (DecoderPlan.ts): reads what the plan needs to
 * know of the decoder file, applies the rewrites it asks for, and opens the decoder (and, where
 * they differ, the decoder for runs of several rows), embed_tokens and the media encoders.
 */
import { createHash } from "node:crypto"
import { basename, dirname } from "node:path"
import type * as ort from "onnxruntime-node"
import { type DecoderFiles, type DecoderInterface, decoderFiles, decoderInterface } from "../../models/DecoderLayout.js"
import type { Dtype } from "../../models/Dtype.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { rewriteRowQuantization } from "../../models/onnx/RowQuantizeRewrite.js"
import { rewriteSharedCache, sharedCacheInputs } from "../../models/onnx/SharedCacheRewrite.js"
import { exposeHiddenStates } from "../../models/onnx/HiddenStatesOutput.js"
import { int8ActivationsLevel, withMatMulNBitsAccuracy } from "../../models/onnx/MatMulNBitsAccuracy.js"
import { graphWithWeightsInPlace, initializerBytes } from "../../models/onnx/WeightsInPlace.js"
import type { PackedWeightsUse } from "../common/PackedWeights.js"
import { createPackedSession, createSession } from "../common/Sessions.js"
import {
  addsScoreBiases,
  chooseDecoder,
  type DecoderChoice,
  type KvCacheMode,
  planDecoder,
  type QuantizedRows
} from "./DecoderPlan.js"
import { MediaEncoders } from "./MediaEncoders.js"

export interface DecoderSessions {
  /** The files it runs: layout and dtype. */
  readonly files: DecoderFiles
  readonly choice: DecoderChoice
  readonly io: DecoderInterface
  readonly embed: ort.InferenceSession | undefined
  readonly decoder: ort.InferenceSession
  /** Runs of several rows, on a decoder that quantises per tensor: the per-row rewrite of `decoder`. */
  readonly rowsDecoder: ort.InferenceSession | undefined
  readonly encoders: MediaEncoders
  /** With a packed-weights folder: where the decoder's packed weights came from, and its copy's name there. */
  readonly packedWeights?: { readonly use: PackedWeightsUse; readonly copy: string }
}

/** The dtypes whose exports quantise activations with DynamicQuantizeLinear. */
const dynamicallyQuantised: ReadonlyArray<Dtype> = ["q8", "int8", "uint8"]

const metadataOf = (values: ReadonlyArray<ort.InferenceSession.ValueMetadata>) =>
  values.flatMap((value) => (value.isTensor ? [{ name: value.name, type: value.type, shape: value.shape }] : []))

/** How the decoder runs: see DecoderPlan.ts, and MatMulNBitsAccuracy.ts for `q4Activations`. */
export interface DecoderOptions {
  readonly quantizedRows?: QuantizedRows
  readonly kvCache?: KvCacheMode
  readonly q4Activations?: "exported" | "int8"
  /**
   * A per-node profile of the decoder's runs, as ONNX Runtime writes it (`<prefix>-decoder_<time>.json`,
   * and `<prefix>-rows_...` for a rows decoder), when the runner closes: a bench's.
   */
  readonly profilePrefix?: string
  /**
   * The folder decoders' packed weights are kept in (PackedWeights.ts, `serve --packed-weights-dir`):
   * a decoder on the CPU opens from its kept copy, or writes one.
   */
  readonly packedWeightsDir?: string
}

/** Opens the model's decoder files at `dtype` (by default fp32, or the closest there is). */
export const openDecoderSessions = async (
  model: ModelDirectory,
  device: string,
  threads: number,
  dtype: Dtype | undefined,
  options: DecoderOptions
): Promise<DecoderSessions> => {
  const spec = model.decoder
  if (spec === undefined) throw new Error(`${model.path} is not a decoder: its config.json has no vocab_size`)
  const files = decoderFiles(model, dtype)
  // Only the decoder's threads spin between runs: the others run briefly before it, on the same cores.
  const session = (path: string | undefined) =>
    path === undefined ? Promise.resolve(undefined) : createSession(path, device, threads, { spin: false })
  // The decoder's graph, its weights left in the file (WeightsInPlace.ts): what the checks and the
  // rewrites read, read once; every decoder made from it finds its weights in the file's folder.
  // It gives its final hidden states too (HiddenStatesOutput.ts), and with int8 activations its
  // 4-bit MatMulNBits nodes compute in int8: the graph every decoder is made from.
  let graphRead: Promise<Uint8Array> | undefined
  const graph = () => {
    graphRead ??= graphWithWeightsInPlace(files.decoder).then((read) => {
      const bytes = exposeHiddenStates(read.bytes).bytes ?? read.bytes
      return options.q4Activations === "int8" ? withMatMulNBitsAccuracy(bytes, int8ActivationsLevel).bytes : bytes
    })
    return graphRead
  }
  // Only 8-bit exports are read: a DynamicQuantizeLinear node's op type is in the graph as written.
  const quantisesPerTensor =
    dynamicallyQuantised.includes(files.dtype) &&
    (await graph().then((g) => Buffer.from(g.buffer, g.byteOffset, g.byteLength))).includes("DynamicQuantizeLinear")
  const plan = planDecoder({
    quantizedRows: options.quantizedRows ?? "apart",
    kvCache: options.kvCache ?? "shared",
    quantisesPerTensor,
    slidingWindow: spec.slidingWindow !== undefined,
    scoreBiases: addsScoreBiases(model.rawConfig),
    device
  })
  const geometry = { heads: spec.heads, kvHeads: spec.keyValueHeads, headDim: spec.headDim }
  const perRow = plan.rowRewrite
    ? rewriteRowQuantization(await graph(), initializerBytes(dirname(files.decoder)))
    : undefined
  const rows = perRow !== undefined && perRow.rewritten > 0 ? perRow.bytes : undefined
  const shared = plan.sharedCache.rewrite ? rewriteSharedCache(await graph(), geometry) : undefined
  const sharedRows =
    rows !== undefined && shared?.bytes !== undefined ? rewriteSharedCache(rows, geometry).bytes : undefined
  const choice = chooseDecoder(plan, {
    rows: rows !== undefined,
    shared:
      shared === undefined
        ? undefined
        : shared.bytes !== undefined
          ? { matched: true }
          : { matched: false, reason: shared.reason },
    sharedRows: sharedRows !== undefined
  })
  const decoderOptions = (name: string) => ({
    spin: true,
    externalDataFolder: dirname(files.decoder),
    ...(options.profilePrefix === undefined ? {} : { profilePrefix: `${options.profilePrefix}-${name}` })
  })
  // Decoders on the CPU keep their packed weights in the folder when there is one (one copy for each
  // graph a decoder is made from); a rows decoder's use counts with the decoder's.
  const packedDir = device.startsWith("cpu") ? options.packedWeightsDir : undefined
  const decoderSession = async (graphBytes: Uint8Array, name: string) => {
    if (packedDir === undefined)
      return { session: await createSession(graphBytes, device, threads, decoderOptions(name)), packed: undefined }
    const made = await createPackedSession(graphBytes, device, threads, decoderOptions(name), {
      dir: packedDir,
      // The model's folder by name and by a hash of its path: two models of one name keep a copy each.
      decoder: `${basename(model.path)}-${createHash("sha256").update(model.path).digest("hex").slice(0, 8)}-${basename(files.decoder, ".onnx")}-${name}`
    })
    return { session: made.session, packed: { use: made.packedWeights, copy: made.copy } }
  }
  const [embed, decoder, rowsDecoder, vision, audio] = await Promise.all([
    session(files.embedTokens),
    decoderSession(choice.decoder === "shared" ? shared!.bytes! : await graph(), "decoder"),
    choice.rowsDecoder === undefined
      ? undefined
      : decoderSession(choice.rowsDecoder === "shared-rows" ? sharedRows! : rows!, "rows"),
    session(files.vision),
    session(files.audio)
  ])
  const own = new Set<string>(Object.values(sharedCacheInputs))
  const io = decoderInterface(
    metadataOf(decoder.session.inputMetadata).filter((value) => !own.has(value.name)),
    metadataOf(decoder.session.outputMetadata),
    { layers: spec.layers, kvHeads: spec.keyValueHeads, headDim: spec.headDim, firstPosition: spec.firstPosition },
    files.decoder.slice(model.path.length + 1),
    model.path
  )
  return {
    files,
    choice,
    io,
    embed,
    decoder: decoder.session,
    rowsDecoder: rowsDecoder?.session,
    encoders: new MediaEncoders(model.path, vision, audio),
    ...(decoder.packed === undefined ? {} : { packedWeights: decoder.packed })
  }
}
