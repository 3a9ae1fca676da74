import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { InvalidModelDirectory, loadModelDirectory } from "../../src/models/ModelDirectory.js"
import { ChatTemplateError, ChatTokenizer } from "../../src/models/Tokenizer.js"
import { llama2ChatTemplate, writeTokenizerModel } from "./support/tokenizerModels.js"

/** Where a model's chat template is read from, and the errors a broken tokenizer or template gives. */

let root: string
let next = 0

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-chat-templates-"))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const hello = [{ role: "user", content: "hi" }] as const

/** A Llama 2 tokenizer directory with the given template sources. */
const model = (options: {
  readonly config?: unknown
  readonly files?: Readonly<Record<string, string>>
  readonly editTokenizer?: (tokenizer: Record<string, unknown>) => Record<string, unknown>
}) =>
  writeTokenizerModel(root, `model-${next++}`, "llama2", {
    editConfig: (config) => (options.config === undefined ? config : { ...config, chat_template: options.config }),
    ...(options.editTokenizer === undefined ? {} : { editTokenizer: options.editTokenizer }),
    ...(options.files === undefined ? {} : { files: options.files })
  })

const tokenizerOf = async (dir: string) => new ChatTokenizer(await loadModelDirectory(dir))

/** What `run` throws; fails the test when it does not throw. */
const thrown = async (run: () => unknown): Promise<unknown> => {
  try {
    await run()
  } catch (error) {
    return error
  }
  throw new Error("expected an error")
}

describe("chat template sources", () => {
  const jinja = "{{ 'from jinja: ' + messages[0]['content'] }}"
  const json = JSON.stringify({ chat_template: "{{ 'from json: ' + messages[0]['content'] }}" })
  const config = "{{ 'from tokenizer_config: ' + messages[0]['content'] }}"

  it("takes chat_template.jinja over chat_template.json over tokenizer_config.json", async () => {
    const all = await tokenizerOf(
      await model({ config, files: { "chat_template.jinja": jinja, "chat_template.json": json } })
    )
    expect(all.applyChatTemplate(hello)).toBe("from jinja: hi")
    const noJinja = await tokenizerOf(await model({ config, files: { "chat_template.json": json } }))
    expect(noJinja.applyChatTemplate(hello)).toBe("from json: hi")
    const configOnly = await tokenizerOf(await model({ config }))
    expect(configOnly.applyChatTemplate(hello)).toBe("from tokenizer_config: hi")
  })

  it("reads named templates from chat_template.json", async () => {
    const named = JSON.stringify({
      chat_template: [
        { name: "default", template: "{{ 'default: ' + messages[0]['content'] }}" },
        { name: "rag", template: "{{ 'rag: ' + messages[0]['content'] }}" }
      ]
    })
    const tokenizer = await tokenizerOf(await model({ files: { "chat_template.json": named } }))
    expect(tokenizer.applyChatTemplate(hello)).toBe("default: hi")
    expect(tokenizer.applyChatTemplate(hello, { template: "rag" })).toBe("rag: hi")
  })

  it("gives the template the tokenizer_config.json special tokens and add_generation_prompt", async () => {
    const template =
      "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token is defined }}|{% if add_generation_prompt %}GEN{% endif %}"
    const tokenizer = await tokenizerOf(await model({ files: { "chat_template.jinja": template } }))
    expect(tokenizer.applyChatTemplate(hello)).toBe("<s>|</s>|<unk>|false|GEN")
    expect(tokenizer.applyChatTemplate(hello, { addGenerationPrompt: false })).toBe("<s>|</s>|<unk>|false|")
  })
})

describe("clear errors", () => {
  it("names tokenizer.json when it is not JSON", async () => {
    const dir = await model({})
    await writeFile(join(dir, "tokenizer.json"), '{"model": ')
    const error = await thrown(() => loadModelDirectory(dir))
    expect(error).toBeInstanceOf(InvalidModelDirectory)
    expect((error as Error).message).toMatch(/tokenizer\.json is not valid JSON/)
  })

  it("names tokenizer.json when the tokenizer cannot be built from it", async () => {
    const directory = await loadModelDirectory(
      await model({ editTokenizer: (tokenizer) => ({ ...tokenizer, model: { type: "Nonsense" } }) })
    )
    const error = await thrown(() => new ChatTokenizer(directory))
    expect(error).toBeInstanceOf(InvalidModelDirectory)
    expect((error as Error).message).toMatch(/tokenizer\.json cannot be loaded: Unknown TokenizerModel type: Nonsense/)
  })

  it("names the template file when the template does not parse", async () => {
    const directory = await loadModelDirectory(await model({ files: { "chat_template.jinja": "{% if %}{% endif" } }))
    const error = await thrown(() => new ChatTokenizer(directory))
    expect(error).toBeInstanceOf(InvalidModelDirectory)
    expect((error as Error).message).toMatch(/chat template chat_template\.jinja: it does not parse: .+/)
  })

  it("names chat_template.json when it is not a template", async () => {
    const directory = await loadModelDirectory(
      await model({ files: { "chat_template.json": JSON.stringify({ template: "x" }) } })
    )
    const error = await thrown(() => new ChatTokenizer(directory))
    expect(error).toBeInstanceOf(InvalidModelDirectory)
    expect((error as Error).message).toMatch(/chat_template\.json: .*chat_template/)
  })

  it("names the template and says what it raised when it refuses the messages", async () => {
    const tokenizer = await tokenizerOf(await model({ files: { "chat_template.jinja": llama2ChatTemplate } }))
    const error = await thrown(() =>
      tokenizer.applyChatTemplate([
        { role: "user", content: "one" },
        { role: "user", content: "two" }
      ])
    )
    expect(error).toBeInstanceOf(ChatTemplateError)
    expect(error).toMatchObject({
      template: "chat_template.jinja",
      reason: "Conversation roles must alternate user/assistant/user/assistant/..."
    })
  })

  it("names the named template that fails", async () => {
    const tokenizer = await tokenizerOf(
      await model({
        config: [
          { name: "default", template: "ok" },
          { name: "broken", template: "{{ messages[0]['content'].nonexistent() }}" }
        ]
      })
    )
    expect(tokenizer.applyChatTemplate(hello)).toBe("ok")
    const error = await thrown(() => tokenizer.applyChatTemplate(hello, { template: "broken" }))
    expect(error).toBeInstanceOf(ChatTemplateError)
    expect((error as ChatTemplateError).message).toMatch(/^chat template tokenizer_config\.json \("broken"\): .+/)
  })

  it("says which names there are when none is the default, and that there is no template at all", async () => {
    const named = await tokenizerOf(await model({ config: [{ name: "rag", template: "x" }] }))
    expect(((await thrown(() => named.applyChatTemplate(hello))) as Error).message).toBe(
      'chat template tokenizer_config.json ("default"): there is no template of that name in tokenizer_config.json (it has rag)'
    )
    const none = await tokenizerOf(await model({}))
    expect(((await thrown(() => none.applyChatTemplate(hello))) as Error).message).toMatch(
      /this model has none \(no chat_template\.jinja, chat_template\.json, nor chat_template in tokenizer_config\.json\)/
    )
  })
})
