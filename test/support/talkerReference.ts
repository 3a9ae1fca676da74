import * as ort from "onnxruntime-node"
import { type ChatMessage, ChatTokenizer } from "../../src/models/Tokenizer.js"
import { GenerationConfig } from "../../src/models/GenerationConfig.js"
import { loadModelDirectory, onnxPath } from "../../src/models/ModelDirectory.js"
import { exposeHiddenStates } from "../../src/models/onnx/HiddenStatesOutput.js"
import type { ModelFiles } from "../../src/models/recipes/Recipe.js"
import { readFile } from "node:fs/promises"

/**
 * The speaking pipeline run in-process, graph after graph, for tests to hold the platform's
 * answers to: a thinker's greedy answer and its final hidden states (each step the whole sequence
 * run again, no cache), then a talker's greedy frames from them.
 */

const int64 = (values: ArrayLike<number>, dims: ReadonlyArray<number>) =>
  new ort.Tensor("int64", BigInt64Array.from(Array.from(values), BigInt), dims)

const session = (source: Uint8Array | string) =>
  typeof source === "string"
    ? ort.InferenceSession.create(source, { intraOpNumThreads: 1 })
    : ort.InferenceSession.create(source, { intraOpNumThreads: 1 })

const emptyPasts = (decoder: ort.InferenceSession, kvHeads: number, headDim: number) =>
  Object.fromEntries(
    decoder.inputNames
      .filter((name) => name.startsWith("past_key_values."))
      .map((name) => [name, new ort.Tensor("float32", new Float32Array(0), [1, kvHeads, 0, headDim])])
  )

export interface ThinkerAnswer {
  readonly promptIds: ReadonlyArray<number>
  /** Every token generated, the one that stopped it included (as the platform forwards them). */
  readonly generated: ReadonlyArray<number>
  readonly text: string
  /** [prompt + generated, hidden]. */
  readonly hiddenStates: Float32Array
  readonly hiddenSize: number
}

/** A split-layout text LLM's greedy answer to text-only messages, and its final hidden states over prompt and answer. */
export const thinkerReference = async (
  modelDir: string,
  messages: ReadonlyArray<ChatMessage>,
  maxTokens: number
): Promise<ThinkerAnswer> => {
  const model = await loadModelDirectory(modelDir)
  const decoderSpec = model.decoder!
  const tokenizer = new ChatTokenizer(model)
  const promptIds = tokenizer.encodeChat(messages, { addGenerationPrompt: true })
  const stops = new Set(GenerationConfig.of(model).eosTokenIds)
  const embed = await session(onnxPath(model, "embed_tokens"))
  const exported = await readFile(onnxPath(model, "decoder_model_merged"))
  const decoder = await session(exposeHiddenStates(exported).bytes ?? exported)
  const run = async (ids: ReadonlyArray<number>) => {
    const { inputs_embeds } = await embed.run({ input_ids: int64(ids, [1, ids.length]) })
    const outputs = await decoder.run({
      inputs_embeds: inputs_embeds!,
      attention_mask: int64(new Array(ids.length).fill(1), [1, ids.length]),
      ...(decoder.inputNames.includes("position_ids")
        ? {
            position_ids: int64(
              Array.from({ length: ids.length }, (_, i) => i),
              [1, ids.length]
            )
          }
        : {}),
      ...emptyPasts(decoder, decoderSpec.keyValueHeads, decoderSpec.headDim)
    })
    return outputs
  }
  const ids = [...promptIds]
  const generated: Array<number> = []
  while (generated.length < maxTokens) {
    const { logits } = await run(ids)
    const vocabulary = logits!.dims[2]!
    const last = (logits!.data as Float32Array).subarray((ids.length - 1) * vocabulary, ids.length * vocabulary)
    let best = 0
    for (let i = 1; i < vocabulary; i++) if (last[i]! > last[best]!) best = i
    ids.push(best)
    generated.push(best)
    if (stops.has(best)) break
  }
  const states = (await run(ids)).last_hidden_state!
  const text = tokenizer.decode(generated.filter((token) => !stops.has(token)))
  await Promise.all([embed.release(), decoder.release()])
  return {
    promptIds,
    generated,
    text,
    hiddenStates: (states.data as Float32Array).slice(),
    hiddenSize: decoderSpec.hiddenSize
  }
}

/**
 * A talker's greedy frames (architectures/Talker.ts) from a thinker's hidden states, [frames][codebooks].
 * With `promptRows`, the rows after the first `promptRows` trail, as a streamed thinker's do
 * (TalkerRunner.ts): row k, projected, is added to frame k + 1's input.
 */
export const talkerReference = async (
  files: ModelFiles,
  hiddenStates: Float32Array,
  thinkerHidden: number,
  maxFrames: number,
  promptRows?: number
): Promise<Array<Array<number>>> => {
  const config = JSON.parse(new TextDecoder().decode(files.get("config.json")!)) as {
    hidden_size: number
    num_key_value_heads: number
    head_dim: number
    vocab_size: number
    talker: { num_code_groups: number; codebook_size: number }
  }
  const graph = (stem: string) => session(files.get(`onnx/${stem}.onnx`)!)
  const [projection, decoder, predictor, embed] = (await Promise.all(
    ["thinker_projection", "decoder_model_merged", "code_predictor", "codec_embed"].map(graph)
  )) as [ort.InferenceSession, ort.InferenceSession, ort.InferenceSession, ort.InferenceSession]
  const rows = promptRows ?? hiddenStates.length / thinkerHidden
  const trailing = hiddenStates.subarray(rows * thinkerHidden)
  const codebooks = config.talker.num_code_groups
  const begin = config.talker.codebook_size
  const end = begin + 1
  let { inputs_embeds: embeds } = await projection.run({
    thinker_hidden_states: new ort.Tensor("float32", hiddenStates.slice(0, rows * thinkerHidden), [
      1,
      rows,
      thinkerHidden
    ])
  })
  let pasts: Record<string, ort.Tensor> = emptyPasts(decoder, config.num_key_value_heads, config.head_dim)
  let width = 0
  const frames: Array<Array<number>> = []
  while (frames.length < maxFrames) {
    const fresh = embeds!.dims[1]!
    const outputs = await decoder.run({
      inputs_embeds: embeds!,
      attention_mask: int64(new Array(width + fresh).fill(1), [1, width + fresh]),
      position_ids: int64(
        Array.from({ length: fresh }, (_, i) => width + i),
        [1, fresh]
      ),
      ...pasts
    })
    width += fresh
    pasts = Object.fromEntries(
      Object.keys(pasts).map((name) => [name, outputs[`present.${name.slice("past_key_values.".length)}`]!])
    )
    const vocabulary = config.vocab_size
    const logits = (outputs.logits!.data as Float32Array).subarray((fresh - 1) * vocabulary, fresh * vocabulary)
    let first = -1
    for (let i = 0; i < vocabulary; i++) if (i !== begin && (first < 0 || logits[i]! > logits[first]!)) first = i
    if (first === end) break
    const hidden = config.hidden_size
    const state = (outputs.last_hidden_state!.data as Float32Array).slice((fresh - 1) * hidden, fresh * hidden)
    const { codes } = await predictor.run({
      last_hidden_state: new ort.Tensor("float32", state, [1, hidden]),
      first_code: int64([first], [1])
    })
    const frame = [first, ...Array.from(codes!.data as BigInt64Array, Number)]
    frames.push(frame)
    ;({ inputs_embeds: embeds } = await embed.run({ codes: int64(frame, [1, 1, codebooks]) }))
    const row = frames.length - 1
    if ((row + 1) * thinkerHidden <= trailing.length) {
      const { inputs_embeds: projected } = await projection.run({
        thinker_hidden_states: new ort.Tensor(
          "float32",
          trailing.slice(row * thinkerHidden, (row + 1) * thinkerHidden),
          [1, 1, thinkerHidden]
        )
      })
      const sum = embeds!.data as Float32Array
      const add = projected!.data as Float32Array
      for (let i = 0; i < sum.length; i++) sum[i]! += add[i]!
    }
  }
  await Promise.all([projection, decoder, predictor, embed].map((s) => s.release()))
  return frames
}
