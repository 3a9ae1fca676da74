import { Template } from "@huggingface/jinja"
import { Tokenizer } from "@huggingface/tokenizers"
import { InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * A model directory's tokenizer (tokenizer.json) and chat template (tokenizer_config.json),
 * rendered the way transformers' apply_chat_template renders it.
 */

export interface ChatMessage {
  readonly role: string
  readonly content: string | ReadonlyArray<{ readonly type: string; readonly text?: string }>
}

const tokenText = (token: string | { readonly content: string } | null | undefined) =>
  typeof token === "string" ? token : token?.content

export class ChatTokenizer {
  private readonly tokenizer: Tokenizer
  private readonly template: Template | undefined
  private readonly templateTokens: Record<string, string | undefined>

  constructor(model: ModelDirectory) {
    if (model.tokenizer === undefined) {
      throw new InvalidModelDirectory({ path: model.path, reason: "it has no tokenizer.json" })
    }
    const { json, rawConfig, config } = model.tokenizer
    this.tokenizer = new Tokenizer(json, rawConfig)
    const chatTemplate = config.chat_template
    const source =
      typeof chatTemplate === "string" ? chatTemplate : chatTemplate?.find((t) => t.name === "default")?.template
    this.template = source === undefined ? undefined : new Template(source)
    this.templateTokens = { bos_token: tokenText(config.bos_token), eos_token: tokenText(config.eos_token) }
  }

  /** Token ids of `text`; special tokens written in the text (e.g. "<|im_start|>") are recognized. */
  encode(text: string): Array<number> {
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids
  }

  decode(ids: ReadonlyArray<number>, options: { readonly skipSpecialTokens?: boolean } = {}): string {
    // tokenizers.js refuses an empty list; nothing decodes to nothing.
    if (ids.length === 0) return ""
    return this.tokenizer.decode([...ids], { skip_special_tokens: options.skipSpecialTokens ?? false })
  }

  tokenId(token: string): number | undefined {
    return this.tokenizer.token_to_id(token)
  }

  applyChatTemplate(
    messages: ReadonlyArray<ChatMessage>,
    options: { readonly addGenerationPrompt?: boolean } = {}
  ): string {
    if (this.template === undefined) throw new Error("this model's tokenizer_config.json has no chat_template")
    return this.template.render({
      messages,
      add_generation_prompt: options.addGenerationPrompt ?? true,
      ...this.templateTokens
    })
  }
}
