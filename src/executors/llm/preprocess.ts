/**
 * The LLM router's threads: media preprocessing (../common/media/preprocess.ts), and the prompt
 * work too long to do on the router's event loop, where every request's tokens are streamed:
 * tokenizing a long prompt, and checking a request's response format (compiling its schema). A
 * thread loads the model's tokenizer, and its schemas' compiler, once, when first asked.
 */
import { loadModelDirectory, type ModelDirectory } from "../../models/ModelDirectory.js"
import type { LiteralPrompt } from "../../models/SpecialTokenText.js"
import { ChatTokenizer } from "../../models/Tokenizer.js"
import { Constraints, type ResponseFormat, SchemaTooLarge, UnspelledBytes, UnsupportedSchema } from "./Constraints.js"

export * from "../common/media/preprocess.js"

const models = new Map<string, Promise<ModelDirectory>>()
const tokenizers = new Map<string, Promise<ChatTokenizer>>()
const constraints = new Map<string, Promise<Constraints>>()

const once = <A>(cache: Map<string, Promise<A>>, modelDir: string, make: (model: ModelDirectory) => A): Promise<A> => {
  let known = cache.get(modelDir)
  if (known === undefined) {
    let model = models.get(modelDir)
    if (model === undefined) {
      model = loadModelDirectory(modelDir)
      models.set(modelDir, model)
    }
    known = model.then(make)
    cache.set(modelDir, known)
  }
  return known
}

/** A prompt's token ids: the tokenizer's own special tokens (a BOS) added only to a prompt without literals, when asked. */
export const tokenize = async (input: {
  readonly modelDir: string
  readonly prompt: LiteralPrompt
  readonly addSpecialTokens: boolean
}): Promise<Int32Array> => {
  const tokenizer = await once(tokenizers, input.modelDir, (model) => new ChatTokenizer(model))
  return Int32Array.from(tokenizer.encodePrompt(input.prompt, { addSpecialTokens: input.addSpecialTokens }))
}

/** Why the decoder cannot hold a request's answers to its format, as the request's 400 says it; undefined when it can. */
export const checkFormat = async (input: {
  readonly modelDir: string
  readonly format: ResponseFormat
}): Promise<string | undefined> => {
  const checker = await once(constraints, input.modelDir, (model) => new Constraints(model, model.decoder!.vocabSize))
  try {
    checker.check(input.format)
    return undefined
  } catch (error) {
    if (error instanceof UnsupportedSchema || error instanceof SchemaTooLarge)
      return `the schema cannot be held to: ${error.message}`
    if (error instanceof UnspelledBytes) return `this model cannot decode under a schema: ${error.message}`
    throw error
  }
}
