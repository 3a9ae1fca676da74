import { Tokenizer } from "@huggingface/tokenizers"
import { InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * A model directory's tokenizer as an embedding model uses it: a text becomes its ids with the
 * special tokens the tokenizer's post-processor adds (BERT's [CLS] … [SEP], the <|endoftext|> that
 * Qwen3-Embedding's appends), read with the implementation transformers.js uses.
 */
export class TextTokenizer {
  private readonly tokenizer: Tokenizer

  constructor(model: ModelDirectory) {
    if (model.tokenizer === undefined) {
      throw new InvalidModelDirectory({ path: model.path, reason: "it has no tokenizer.json" })
    }
    try {
      this.tokenizer = new Tokenizer(model.tokenizer.json, model.tokenizer.rawConfig)
    } catch (error) {
      throw new InvalidModelDirectory({
        path: model.path,
        reason: `tokenizer.json cannot be loaded: ${(error as Error).message}`
      })
    }
  }

  /** The ids of `text`, special tokens included. */
  encode(text: string): Array<number> {
    return this.tokenizer.encode(text, { add_special_tokens: true }).ids
  }

  /**
   * The ids of `text` cut to at most `maxTokens`: its first tokens, and the special tokens around
   * them as they are around the whole text (sentence-transformers' truncation, which keeps BERT's
   * [SEP]). Answers undefined when the special tokens alone take more than `maxTokens`.
   */
  encodeTruncated(text: string, maxTokens: number): Array<number> | undefined {
    const full = this.encode(text)
    if (full.length <= maxTokens) return full
    const content = this.tokenizer.encode(text, { add_special_tokens: false }).ids
    const specials = full.length - content.length
    if (specials > maxTokens) return undefined
    const before = contentOffset(full, content)
    return [...full.slice(0, before), ...content.slice(0, maxTokens - specials), ...full.slice(before + content.length)]
  }
}

/** Where `content` lies in `full` (the same ids with special tokens around them). */
const contentOffset = (full: ReadonlyArray<number>, content: ReadonlyArray<number>): number => {
  for (let offset = 0; offset + content.length <= full.length; offset++) {
    if (content.every((id, index) => full[offset + index] === id)) return offset
  }
  throw new Error("the tokenizer's special tokens are not around the text's own tokens")
}
