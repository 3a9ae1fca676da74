/**
 * What Eric's preprocessing threads run: media decoding (common/media) and the tokenization of
 * text inputs, so that a request of many long texts does not hold the router's event loop.
 */
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { TextTokenizer } from "../../models/TextTokenizer.js"
import { BadRequest } from "../common/errors.js"

export * from "../common/media/preprocess.js"

/** Each thread reads a model's tokenizer once. */
const tokenizers = new Map<string, Promise<TextTokenizer>>()

const tokenizerOf = (modelDir: string): Promise<TextTokenizer> => {
  let tokenizer = tokenizers.get(modelDir)
  if (tokenizer === undefined) {
    tokenizer = loadModelDirectory(modelDir).then((model) => new TextTokenizer(model))
    tokenizers.set(modelDir, tokenizer)
  }
  return tokenizer
}

/** The token ids of each text, special tokens included; with `truncateTo`, cut to that many (see TextTokenizer). */
export const tokenize = async (input: {
  readonly modelDir: string
  readonly texts: ReadonlyArray<string>
  readonly truncateTo?: number
}): Promise<Array<Int32Array>> => {
  const tokenizer = await tokenizerOf(input.modelDir)
  return input.texts.map((text) => {
    if (input.truncateTo === undefined) return Int32Array.from(tokenizer.encode(text))
    const ids = tokenizer.encodeTruncated(text, input.truncateTo)
    if (ids === undefined) {
      throw new BadRequest({
        message: `truncating to ${input.truncateTo} tokens leaves no room for the text: the model's special tokens take more`
      })
    }
    return Int32Array.from(ids)
  })
}
