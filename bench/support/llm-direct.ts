/**
 * The LLM bench's baseline: a plain greedy generation loop on onnxruntime-node over a decoder
 * model directory (embed_tokens, then decoder_model_merged with its KV cache fed back), one request
 * at a time, with nothing around it: no processes, no HTTP, no tokenizer in the loop.
 */
import * as ort from "onnxruntime-node"
import { type ModelDirectory, onnxPath } from "../../src/models/ModelDirectory.js"

export interface DirectRun {
  readonly tokens: ReadonlyArray<number>
  /** From the call to the first token. */
  readonly firstTokenMs: number
  /** From the first token to the last. */
  readonly decodeMs: number
}

const argmax = (values: Float32Array, from: number, length: number) => {
  let best = 0
  for (let i = 1; i < length; i++) if (values[from + i]! > values[from + best]!) best = i
  return best
}

export class DirectGenerator {
  private constructor(
    private readonly model: ModelDirectory,
    private readonly embed: ort.InferenceSession,
    private readonly decoder: ort.InferenceSession
  ) {}

  static async open(model: ModelDirectory, threads: number): Promise<DirectGenerator> {
    const options: ort.InferenceSession.SessionOptions = {
      executionProviders: ["cpu"],
      intraOpNumThreads: threads,
      interOpNumThreads: 1,
      graphOptimizationLevel: "all"
    }
    return new DirectGenerator(
      model,
      await ort.InferenceSession.create(onnxPath(model, "embed_tokens"), options),
      await ort.InferenceSession.create(onnxPath(model, "decoder_model_merged"), options)
    )
  }

  async generate(prompt: ReadonlyArray<number>, maxNewTokens: number): Promise<DirectRun> {
    const spec = this.model.decoder!
    const started = performance.now()
    const int64 = (values: ReadonlyArray<number>, dims: ReadonlyArray<number>) =>
      new ort.Tensor("int64", BigInt64Array.from(values, BigInt), dims)
    let past: Record<string, ort.Tensor> = {}
    const empty = new ort.Tensor("float32", new Float32Array(0), [1, spec.keyValueHeads, 0, spec.headDim])
    for (let i = 0; i < spec.layers; i++) {
      past[`past_key_values.${i}.key`] = empty
      past[`past_key_values.${i}.value`] = empty
    }
    let inputs = prompt
    let length = 0
    const tokens: Array<number> = []
    let firstTokenAt = 0
    while (tokens.length < maxNewTokens) {
      const embeds = (await this.embed.run({ input_ids: int64(inputs, [1, inputs.length]) })).inputs_embeds!
      const outputs = await this.decoder.run({
        inputs_embeds: embeds,
        attention_mask: int64(new Array<number>(length + inputs.length).fill(1), [1, length + inputs.length]),
        position_ids: int64(
          Array.from(inputs, (_, i) => length + i),
          [1, inputs.length]
        ),
        ...past
      })
      const logits = outputs.logits!.data as Float32Array
      const token = argmax(logits, (inputs.length - 1) * spec.vocabSize, spec.vocabSize)
      tokens.push(token)
      if (tokens.length === 1) firstTokenAt = performance.now()
      length += inputs.length
      inputs = [token]
      past = {}
      for (let i = 0; i < spec.layers; i++) {
        past[`past_key_values.${i}.key`] = outputs[`present.${i}.key`]!
        past[`past_key_values.${i}.value`] = outputs[`present.${i}.value`]!
      }
    }
    return { tokens, firstTokenMs: firstTokenAt - started, decodeMs: performance.now() - firstTokenAt }
  }

  async close(): Promise<void> {
    await Promise.all([this.embed.release(), this.decoder.release()])
  }
}
