import { readFileSync } from "node:fs"
import { join } from "node:path"
import { Template } from "@huggingface/jinja"
import { Tokenizer } from "@huggingface/tokenizers"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { decodeConfig, InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"
import { LiteralEncoder, type LiteralPrompt, SpecialTokens, unmark } from "./SpecialTokenText.js"

/**
 * A model directory's tokenizer (tokenizer.json with tokenizer_config.json) and chat template,
 * read and applied as transformers.js reads and applies them: the same tokenizer implementation,
 * the same Jinja implementation, the same variables given to the template, and a rendered chat
 * tokenized without the tokenizer's own special tokens (the template writes them). A client's texts
 * in a chat are text: a special token spelled in one is its characters (SpecialTokenText.ts).
 *
 * The template comes from the first of, as transformers saves it: chat_template.jinja,
 * chat_template.json (`{"chat_template": ...}`), tokenizer_config.json's `chat_template`. The last
 * two may hold named templates (`[{ name, template }]`); "default" is used unless a name is given.
 */

export interface ChatMessage {
  readonly role: string
  /** Null for an assistant's message that only calls tools. */
  readonly content: string | ReadonlyArray<{ readonly type: string; readonly text?: string }> | null
  /** An assistant's tool calls, their arguments as objects (templates write them with `tojson`). */
  readonly tool_calls?: ReadonlyArray<{
    readonly id: string
    readonly type: "function"
    readonly function: { readonly name: string; readonly arguments: unknown }
  }>
  readonly tool_call_id?: string
  readonly name?: string
}

/** A chat template that cannot be used for these messages (it raised, or there is none to use). */
export class ChatTemplateError extends Schema.TaggedError<ChatTemplateError>()("ChatTemplateError", {
  /** Where the template comes from, e.g. `chat_template.jinja` or `tokenizer_config.json ("tool_use")`. */
  template: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `chat template ${this.template}: ${this.reason}`
  }
}

const ChatTemplateValue = Schema.Union(
  Schema.String,
  Schema.Array(Schema.Struct({ name: Schema.String, template: Schema.String }))
)
const ChatTemplateJson = Schema.Struct({ chat_template: ChatTemplateValue })

/** Where a model's chat templates come from, and the templates by name (one, unnamed, is "default"). */
interface TemplateSource {
  readonly file: string
  readonly named: boolean
  readonly templates: ReadonlyMap<string, string>
}

/** The special tokens transformers.js hands to a chat template, from tokenizer_config.json. */
const specialTokenAttributes = [
  "bos_token",
  "eos_token",
  "unk_token",
  "sep_token",
  "pad_token",
  "cls_token",
  "mask_token"
] as const

export class ChatTokenizer {
  private readonly tokenizer: Tokenizer
  private readonly source: TemplateSource | undefined
  private readonly compiled = new Map<string, Template>()
  private readonly specialTokens: Readonly<Record<string, string>>
  /** The special tokens a client's text may spell, which a prompt takes as text. */
  readonly specials: SpecialTokens
  private readonly literalEncoder: LiteralEncoder

  constructor(model: ModelDirectory) {
    if (model.tokenizer === undefined) {
      throw new InvalidModelDirectory({ path: model.path, reason: "it has no tokenizer.json" })
    }
    const { json, rawConfig } = model.tokenizer
    try {
      this.tokenizer = new Tokenizer(json, rawConfig)
    } catch (error) {
      throw new InvalidModelDirectory({
        path: model.path,
        reason: `tokenizer.json cannot be loaded: ${(error as Error).message}`
      })
    }
    this.specialTokens = specialTokens(model.path, rawConfig)
    this.specials = SpecialTokens.of(this.tokenizer)
    this.literalEncoder = new LiteralEncoder(this.tokenizer, rawConfig)
    this.source = templateSource(model)
    if (this.source?.templates.has("default") === true) {
      try {
        this.compile("default")
      } catch (error) {
        throw new InvalidModelDirectory({ path: model.path, reason: (error as ChatTemplateError).message })
      }
    }
  }

  /**
   * Token ids of `text`. Added tokens written in the text (e.g. "<|im_start|>") are recognized;
   * the tokenizer's own special tokens (a Llama BOS) are added only when asked.
   */
  encode(text: string, options: { readonly addSpecialTokens?: boolean } = {}): Array<number> {
    return this.tokenizer.encode(text, { add_special_tokens: options.addSpecialTokens ?? false }).ids
  }

  /**
   * Token ids of a prompt: special tokens written in its literals are their characters. The
   * tokenizer's own special tokens are added, when asked, to a prompt without literals alone (a
   * raw prompt): a chat's template writes its own.
   */
  encodePrompt(prompt: LiteralPrompt, options: { readonly addSpecialTokens?: boolean } = {}): Array<number> {
    if (prompt.literals.length === 0) return this.encode(prompt.text, options)
    if (options.addSpecialTokens === true) throw new Error("a prompt with literals takes no added special tokens")
    return this.literalEncoder.encode(prompt)
  }

  decode(ids: ReadonlyArray<number>, options: { readonly skipSpecialTokens?: boolean } = {}): string {
    // tokenizers.js refuses an empty list; nothing decodes to nothing.
    if (ids.length === 0) return ""
    return this.tokenizer.decode([...ids], { skip_special_tokens: options.skipSpecialTokens ?? false })
  }

  tokenId(token: string): number | undefined {
    return this.tokenizer.token_to_id(token)
  }

  /** The source of the model's chat template (the default one, or the one named), if it has it. */
  chatTemplateSource(name = "default"): string | undefined {
    return this.source?.templates.get(name)
  }

  /** The names of the model's chat templates ("default" alone for an unnamed one). */
  get chatTemplateNames(): ReadonlyArray<string> {
    return [...(this.source?.templates.keys() ?? [])]
  }

  /**
   * The chat template (the default one, or the one named) rendered over the messages, with the
   * variables transformers.js gives it; throws a ChatTemplateError naming the template when it
   * cannot be rendered.
   */
  applyChatTemplate(
    messages: ReadonlyArray<ChatMessage>,
    options: {
      readonly addGenerationPrompt?: boolean
      readonly template?: string
      /** The request's tools as OpenAI gives them (`{ type: "function", function }`), for templates that take tools. */
      readonly tools?: ReadonlyArray<unknown>
    } = {}
  ): string {
    const name = options.template ?? "default"
    const template = this.compile(name)
    try {
      return template.render({
        messages,
        add_generation_prompt: options.addGenerationPrompt ?? true,
        tools: options.tools === undefined || options.tools.length === 0 ? null : options.tools,
        documents: null,
        ...this.specialTokens
      })
    } catch (error) {
      throw new ChatTemplateError({ template: this.describe(name), reason: (error as Error).message })
    }
  }

  /**
   * The ids the model runs for a chat: the rendered template, its special tokens as written, and
   * the messages' contents as text, special tokens spelled in them included.
   */
  encodeChat(
    messages: ReadonlyArray<ChatMessage>,
    options: { readonly addGenerationPrompt?: boolean; readonly template?: string } = {}
  ): Array<number> {
    const marker = this.specials.marker()
    const marked = messages.map((message) => ({
      ...message,
      content:
        typeof message.content === "string"
          ? marker.text(message.content)
          : (message.content?.map((part) =>
              part.text === undefined ? part : { ...part, text: marker.text(part.text) }
            ) ?? null)
    }))
    return this.encodePrompt(unmark(this.applyChatTemplate(marked, options), marker.marks))
  }

  private describe(name: string): string {
    if (this.source === undefined) return `"${name}"`
    return this.source.named || name !== "default" ? `${this.source.file} ("${name}")` : this.source.file
  }

  private compile(name: string): Template {
    const cached = this.compiled.get(name)
    if (cached !== undefined) return cached
    const source = this.source?.templates.get(name)
    if (source === undefined) {
      throw new ChatTemplateError({
        template: this.describe(name),
        reason:
          this.source === undefined
            ? "this model has none (no chat_template.jinja, chat_template.json, nor chat_template in tokenizer_config.json)"
            : `there is no template of that name in ${this.source.file} (it has ${this.chatTemplateNames.join(", ")})`
      })
    }
    let template: Template
    try {
      template = new Template(source)
    } catch (error) {
      throw new ChatTemplateError({
        template: this.describe(name),
        reason: `it does not parse: ${(error as Error).message}`
      })
    }
    this.compiled.set(name, template)
    return template
  }
}

/** The special tokens tokenizer_config.json names, as strings (an added-token object gives its content). */
const specialTokens = (path: string, config: Readonly<Record<string, unknown>>): Record<string, string> => {
  const tokens: Record<string, string> = {}
  for (const key of specialTokenAttributes) {
    const value = config[key]
    if (!value) continue
    if (typeof value === "string") {
      tokens[key] = value
    } else if (typeof value === "object" && typeof (value as { content?: unknown }).content === "string") {
      tokens[key] = (value as { content: string }).content
    } else {
      throw new InvalidModelDirectory({
        path,
        reason: `tokenizer_config.json: ${key} must be a string or an added token with a content`
      })
    }
  }
  return tokens
}

const readOptional = (dir: string, file: string): string | undefined => {
  try {
    return readFileSync(join(dir, file), "utf8")
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined
    throw new InvalidModelDirectory({ path: dir, reason: `cannot read ${file}: ${(error as Error).message}` })
  }
}

const fromValue = (file: string, value: typeof ChatTemplateValue.Type): TemplateSource =>
  typeof value === "string"
    ? { file, named: false, templates: new Map([["default", value]]) }
    : { file, named: true, templates: new Map(value.map(({ name, template }) => [name, template])) }

const templateSource = (model: ModelDirectory): TemplateSource | undefined => {
  const jinja = readOptional(model.path, "chat_template.jinja")
  if (jinja !== undefined) return fromValue("chat_template.jinja", jinja)
  const json = readOptional(model.path, "chat_template.json")
  if (json !== undefined) {
    let value: unknown
    try {
      value = JSON.parse(json)
    } catch (error) {
      throw new InvalidModelDirectory({
        path: model.path,
        reason: `chat_template.json is not valid JSON: ${(error as Error).message}`
      })
    }
    const decoded = Either.getOrThrowWith(
      decodeConfig(ChatTemplateJson, value),
      (reason) => new InvalidModelDirectory({ path: model.path, reason: `chat_template.json: ${reason}` })
    )
    return fromValue("chat_template.json", decoded.chat_template)
  }
  const fromConfig = model.tokenizer?.config.chat_template
  return fromConfig === undefined ? undefined : fromValue("tokenizer_config.json", fromConfig)
}
