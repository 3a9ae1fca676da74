/**
 * Whisper on one device: onnx/encoder_model.onnx and onnx/decoder_model_merged.onnx, as the
 * community exports them. A batch of passes (a window's features and the prompt it follows) is
 * encoded in one run and decoded in lockstep, greedily, under Whisper's rules (WhisperGeneration):
 * the first decoder run takes the prompts and computes each layer's cross-attention keys and
 * values from the encoder's states (use_cache_branch false); every later run takes one token a
 * row, the self-attention cache it grew, and the cross-attention cache as the first run gave it
 * (use_cache_branch true). A row that ends leaves the batch, its caches' rows dropped, so the rest
 * decode without it.
 */
import * as ort from "onnxruntime-node"
import { type ModelDirectory, onnxPath } from "../../models/ModelDirectory.js"
import {
  argmax,
  type WhisperPass,
  type WhisperSettings,
  whisperSettings,
  whisperStepRules
} from "../../models/WhisperGeneration.js"
import { createSession } from "../common/Sessions.js"

type Feeds = Record<string, ort.Tensor>

/** Rows `keep` of a tensor whose first axis is the batch. */
const keepRows = (tensor: ort.Tensor, keep: ReadonlyArray<number>): ort.Tensor => {
  const [batch, ...rest] = tensor.dims
  if (keep.length === batch) return tensor
  const rowSize = rest.reduce((a, b) => a * b, 1)
  const data = tensor.data as Float32Array
  const out = new Float32Array(keep.length * rowSize)
  keep.forEach((row, index) => out.set(data.subarray(row * rowSize, (row + 1) * rowSize), index * rowSize))
  return new ort.Tensor("float32", out, [keep.length, ...rest])
}

export class SpeechRecognizer {
  private constructor(
    readonly settings: WhisperSettings,
    private readonly encoder: ort.InferenceSession,
    private readonly decoder: ort.InferenceSession,
    private readonly layers: number,
    private readonly heads: number,
    private readonly headDim: number,
    readonly melBins: number
  ) {}

  static async open(model: ModelDirectory, device: string, threads: number): Promise<SpeechRecognizer> {
    const config = model.rawConfig
    const dModel = Number(config.d_model)
    const heads = Number(config.decoder_attention_heads)
    const layers = Number(config.decoder_layers)
    if (!(dModel > 0 && heads > 0 && layers > 0 && dModel % heads === 0)) {
      throw new Error("config.json must give Whisper's d_model, decoder_attention_heads and decoder_layers")
    }
    const settings = whisperSettings(model)
    const encoder = await createSession(onnxPath(model, "encoder_model"), device, threads, { spin: false })
    const decoder = await createSession(onnxPath(model, "decoder_model_merged"), device, threads)
    return new SpeechRecognizer(
      settings,
      encoder,
      decoder,
      layers,
      heads,
      dModel / heads,
      Number(config.num_mel_bins ?? 80)
    )
  }

  /** Each pass's generated tokens (after its prompt), its end token included when it wrote one. */
  async decode(passes: ReadonlyArray<WhisperPass>): Promise<Array<Array<number>>> {
    const results: Array<Array<number>> = passes.map(() => [])
    // Rows decode in lockstep, so one batch holds prompts of one length.
    const byLength = new Map<number, Array<number>>()
    passes.forEach((pass, index) => {
      const group = byLength.get(pass.prompt.length) ?? []
      group.push(index)
      byLength.set(pass.prompt.length, group)
    })
    for (const group of byLength.values()) {
      const outputs = await this.decodeGroup(group.map((index) => passes[index]!))
      group.forEach((index, position) => (results[index] = outputs[position]!))
    }
    return results
  }

  private async decodeGroup(passes: ReadonlyArray<WhisperPass>): Promise<Array<Array<number>>> {
    const batch = passes.length
    const frameValues = passes[0]!.features.length
    const features = new Float32Array(batch * frameValues)
    passes.forEach((pass, row) => {
      if (pass.features.length !== frameValues)
        throw new Error("the passes of a batch have features of different sizes")
      features.set(pass.features, row * frameValues)
    })
    const encoded = await this.encoder.run({
      input_features: new ort.Tensor("float32", features, [batch, this.melBins, frameValues / this.melBins])
    })
    let encoderStates = encoded[this.encoder.outputNames[0]!]!
    const promptLength = passes[0]!.prompt.length
    const inputIds = new BigInt64Array(batch * promptLength)
    passes.forEach((pass, row) => pass.prompt.forEach((id, i) => (inputIds[row * promptLength + i] = BigInt(id))))
    const empty = new ort.Tensor("float32", new Float32Array(0), [batch, this.heads, 0, this.headDim])
    let feeds: Feeds = {
      input_ids: new ort.Tensor("int64", inputIds, [batch, promptLength]),
      encoder_hidden_states: encoderStates,
      use_cache_branch: new ort.Tensor("bool", Uint8Array.of(0), [1])
    }
    for (let layer = 0; layer < this.layers; layer++) {
      for (const kind of ["decoder", "encoder"]) {
        for (const part of ["key", "value"]) feeds[`past_key_values.${layer}.${kind}.${part}`] = empty
      }
    }
    const generated: Array<Array<number>> = passes.map(() => [])
    /** The passes still decoding, by their row in the running batch. */
    let rows = passes.map((_, index) => index)
    const { settings } = this
    // transformers.js checks the length after each token: a prompt at max_length still gets one.
    const maxNew = Math.max(1, settings.maxLength - promptLength)
    // After the first run, the cross-attention outputs only repeat the cache given: not fetched, they
    // are not copied out of ONNX Runtime (megabytes a row each step).
    const cachedFetches = [
      "logits",
      ...Array.from({ length: this.layers }, (_, layer) =>
        ["key", "value"].map((part) => `present.${layer}.decoder.${part}`)
      ).flat()
    ]
    while (rows.length > 0 && generated[rows[0]!]!.length < maxNew) {
      const first = feeds.use_cache_branch!.data[0] === 0
      const outputs = first ? await this.decoder.run(feeds) : await this.decoder.run(feeds, cachedFetches)
      const logits = outputs.logits!
      const [, steps, vocab] = logits.dims as [number, number, number]
      const logitsData = logits.data as Float32Array
      const next: Array<number> = []
      const keep: Array<number> = []
      rows.forEach((pass, row) => {
        const at = (row * steps + steps - 1) * vocab
        const scores = logitsData.slice(at, at + vocab)
        whisperStepRules(settings, scores, passes[pass]!.prompt, generated[pass]!)
        const token = argmax(scores)
        generated[pass]!.push(token)
        if (token !== settings.endOfText && generated[pass]!.length < maxNew) {
          keep.push(row)
          next.push(token)
        }
      })
      if (keep.length === 0) break
      const nextFeeds: Feeds = {
        input_ids: new ort.Tensor("int64", BigInt64Array.from(next, BigInt), [keep.length, 1]),
        use_cache_branch: new ort.Tensor("bool", Uint8Array.of(1), [1])
      }
      encoderStates = keepRows(encoderStates, keep)
      nextFeeds.encoder_hidden_states = encoderStates
      for (let layer = 0; layer < this.layers; layer++) {
        for (const part of ["key", "value"]) {
          nextFeeds[`past_key_values.${layer}.decoder.${part}`] = keepRows(
            outputs[`present.${layer}.decoder.${part}`]!,
            keep
          )
          // The cross-attention cache is what the first run computed; later runs hand it back unchanged.
          const cross = first
            ? outputs[`present.${layer}.encoder.${part}`]!
            : feeds[`past_key_values.${layer}.encoder.${part}`]!
          nextFeeds[`past_key_values.${layer}.encoder.${part}`] = keepRows(cross, keep)
        }
      }
      rows = keep.map((row) => rows[row]!)
      feeds = nextFeeds
    }
    return generated
  }

  async release(): Promise<void> {
    await this.encoder.release()
    await this.decoder.release()
  }
}
