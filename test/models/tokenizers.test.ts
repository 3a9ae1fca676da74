import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { basename, join } from "node:path"
import { AutoTokenizer, env, type PreTrainedTokenizer } from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadModelDirectory } from "../../src/models/ModelDirectory.js"
import { type ChatMessage, ChatTokenizer } from "../../src/models/Tokenizer.js"
import { llama2ChatTemplate, packagedTokenizerConfig, writeTokenizerModel } from "./support/tokenizerModels.js"

/**
 * Real tokenizers (byte-level BPE: Llama 3, Qwen 3; Metaspace/sentencepiece: Llama 2, Gemma 3)
 * and their chat templates, read by ChatTokenizer and by transformers.js from the same model
 * directory: every id and every rendered prompt must be the same.
 */

const texts = [
  "Hello, world!",
  " leading space",
  "  two leading spaces, and two trailing  ",
  "line one\nline two\n\n\tindented\r\nwindows line",
  "\n\nstarts with newlines",
  "numbers 1234567890 3.14159 -42 1,000,000 2024-05-01",
  "unicode: naïve café, Ελληνικά, Русский, 日本語のテキスト, 中文, 한국어, עברית",
  "emoji 🦓🏳️‍🌈👩‍👩‍👧‍👦 and ❤️ 🇯🇵",
  "combining e\u0301 versus \u00e9, ﬁ ligature, full-width ＡＢＣ",
  "code: def f(x):\n    return x**2  # comment\n",
  "special tokens in text: <|im_start|>user\nhi<|im_end|> <s>[INST] x [/INST]</s> <bos><start_of_turn>user\n<end_of_turn> <|begin_of_text|><|eot_id|>",
  "   ",
  "a\u00a0non-breaking space and\u200bzero width",
  "URL https://example.com/path?q=1&r=2#frag",
  "Don't won't I'm we'll they've"
]

const chats: ReadonlyArray<ReadonlyArray<ChatMessage>> = [
  [{ role: "user", content: "Hello!" }],
  [
    { role: "system", content: "You are terse." },
    { role: "user", content: "What is 2+2?" }
  ],
  [
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Hello! How can I help?" },
    { role: "user", content: "  Tell me a joke 🦓\nin two lines. " }
  ],
  [
    { role: "system", content: "Answer in French." },
    { role: "user", content: "One" },
    { role: "assistant", content: "Un" },
    { role: "user", content: "Two <|im_end|> <s>" }
  ]
]

const llama3Template = (await packagedTokenizerConfig("llama3")).chat_template as string

interface Variant {
  readonly name: string
  /** The template transformers.js must be given: it reads tokenizer_config.json's alone. */
  readonly explicitTemplate?: string
  readonly write: (root: string) => Promise<string>
}

const variants: ReadonlyArray<Variant> = [
  { name: "llama3", write: (root) => writeTokenizerModel(root, "llama3", "llama3") },
  { name: "qwen3", write: (root) => writeTokenizerModel(root, "qwen3", "qwen3") },
  { name: "gemma3", write: (root) => writeTokenizerModel(root, "gemma3", "gemma3") },
  {
    name: "llama2 with chat_template.jinja",
    explicitTemplate: llama2ChatTemplate,
    write: (root) =>
      writeTokenizerModel(root, "llama2-jinja", "llama2", { files: { "chat_template.jinja": llama2ChatTemplate } })
  },
  {
    // How transformers converts a sentencepiece Llama with `legacy: false`: no normalizer, a
    // Metaspace pre-tokenizer that prepends "▁" to the first section only.
    name: "llama2 with a Metaspace pre-tokenizer",
    explicitTemplate: llama2ChatTemplate,
    write: (root) =>
      writeTokenizerModel(root, "llama2-metaspace", "llama2", {
        editConfig: (config) => ({ ...config, legacy: false }),
        editTokenizer: (tokenizer) => ({
          ...tokenizer,
          normalizer: null,
          pre_tokenizer: { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false }
        }),
        files: { "chat_template.jinja": llama2ChatTemplate }
      })
  },
  {
    name: "llama3 with chat_template.json",
    explicitTemplate: llama3Template,
    write: (root) =>
      writeTokenizerModel(root, "llama3-json", "llama3", {
        editConfig: ({ chat_template: _, ...rest }) => rest,
        files: { "chat_template.json": JSON.stringify({ chat_template: llama3Template }) }
      })
  },
  {
    name: "qwen3 with named templates",
    write: (root) =>
      writeTokenizerModel(root, "qwen3-named", "qwen3", {
        editConfig: (config) => ({
          ...config,
          chat_template: [
            { name: "tool_use", template: "{{ 'tools: ' + messages[0]['content'] }}" },
            { name: "default", template: config.chat_template }
          ]
        })
      })
  }
]

let root: string
const loaded = new Map<string, { readonly ours: ChatTokenizer; readonly theirs: PreTrainedTokenizer }>()

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-tokenizers-"))
  env.allowRemoteModels = false
  env.localModelPath = root
  for (const variant of variants) {
    const dir = await variant.write(root)
    loaded.set(variant.name, {
      ours: new ChatTokenizer(await loadModelDirectory(dir)),
      theirs: await AutoTokenizer.from_pretrained(basename(dir))
    })
  }
}, 180_000)

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const tokenizers = (name: string) => loaded.get(name)!

describe.each([
  "llama3",
  "qwen3",
  "gemma3",
  "llama2 with chat_template.jinja",
  "llama2 with a Metaspace pre-tokenizer"
])("%s: text", (name) => {
  it("encodes every text to transformers.js's ids, with and without the tokenizer's special tokens", () => {
    const { ours, theirs } = tokenizers(name)
    for (const text of texts) {
      expect(ours.encode(text), text).toEqual(theirs.encode(text, { add_special_tokens: false }))
      expect(ours.encode(text, { addSpecialTokens: true }), text).toEqual(theirs.encode(text))
    }
  })

  it("decodes ids to transformers.js's text", () => {
    const { ours, theirs } = tokenizers(name)
    for (const text of texts.filter((text) => text.trim() !== "")) {
      const ids = theirs.encode(text)
      expect(ours.decode(ids), text).toBe(theirs.decode(ids))
      expect(ours.decode(ids, { skipSpecialTokens: true }), text).toBe(
        theirs.decode(ids, { skip_special_tokens: true })
      )
    }
  })

  it("recognizes special tokens written in the text as single ids", () => {
    const { ours, theirs } = tokenizers(name)
    for (const token of theirs.all_special_tokens) {
      expect(ours.encode(`x${token}y`), token).toContain(ours.tokenId(token))
    }
  })
})

describe.each(variants.map((variant) => [variant.name, variant] as const))("%s: chat", (name, variant) => {
  it("renders every chat as transformers.js's apply_chat_template does, with and without the generation prompt", () => {
    const { ours, theirs } = tokenizers(name)
    for (const messages of chats) {
      for (const addGenerationPrompt of [true, false]) {
        const options = {
          add_generation_prompt: addGenerationPrompt,
          ...(variant.explicitTemplate === undefined ? {} : { chat_template: variant.explicitTemplate })
        }
        const rendered = ours.applyChatTemplate(messages, { addGenerationPrompt })
        expect(rendered).toBe(theirs.apply_chat_template(messages as Array<never>, { ...options, tokenize: false }))
        // A special token spelled in a message is its characters here (specialTokenText.test.ts), not in transformers.js.
        const spelled = messages.some((message) =>
          theirs.all_special_tokens.some((token) => String(message.content).includes(token))
        )
        if (spelled) continue
        expect(ours.encodeChat(messages, { addGenerationPrompt })).toEqual(
          theirs.apply_chat_template(messages as Array<never>, {
            ...options,
            tokenize: true,
            return_tensor: false,
            return_dict: false
          })
        )
      }
    }
  })
})

describe("named templates", () => {
  it("uses the one named default, or the one asked for, as transformers.js does", () => {
    const { ours, theirs } = tokenizers("qwen3 with named templates")
    expect(ours.chatTemplateNames).toEqual(["tool_use", "default"])
    const messages = chats[1]!
    expect(ours.applyChatTemplate(messages, { template: "tool_use" })).toBe(
      theirs.apply_chat_template(messages as Array<never>, { chat_template: "tool_use", tokenize: false })
    )
    expect(ours.applyChatTemplate(messages, { template: "tool_use" })).toBe("tools: You are terse.")
    expect(ours.applyChatTemplate(messages)).toContain("<|im_start|>system\nYou are terse.<|im_end|>")
  })
})
