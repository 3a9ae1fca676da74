import { useEffect, useRef, useState } from "preact/hooks"
import { getJson, type Refusal } from "../api"
import { type AnswerState, ask, replyTextOf, routeOf, shownJson, type Transport } from "../answer"
import { AnswerView } from "../Answer"
import { clipped, RefusalNotice } from "../components"
import {
  type AppDocument,
  type FieldKind,
  fieldKind,
  hasOpenAiChat,
  isChatRequest,
  type RequestShape,
  requestShape
} from "../schema"
import type { AppListJson } from "../../../src/control/gateway/GatewayAnswers"
import type { AppSummary } from "./Apps"

/** A file the page turns into a `data:` URL: within the gateway's default body limit once in base64. */
const maxFileBytes = 20 * 1024 * 1024

const dataUrlOf = (file: File): Promise<string> =>
  new Promise((resolve, reject) => {
    if (file.size > maxFileBytes) return reject(new Error(`${file.name} is larger than 20 MiB`))
    const reader = new FileReader()
    reader.onload = () => resolve(String(reader.result))
    reader.onerror = () => reject(reader.error ?? new Error(`${file.name} could not be read`))
    reader.readAsDataURL(file)
  })

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const dataUrlSummary = (url: string) => {
  const type = /^data:([^;,]*)/.exec(url)?.[1] || "data"
  return `${type}, ${Math.round((url.length * 3) / 4 / 1024)} KiB`
}

const JsonField = ({
  id,
  value,
  onChange
}: {
  readonly id: string
  readonly value: unknown
  readonly onChange: (value: unknown) => void
}) => {
  const [text, setText] = useState(value === undefined ? "" : JSON.stringify(value, null, 2))
  const [problem, setProblem] = useState<string | undefined>(undefined)
  return (
    <>
      <textarea
        id={id}
        class="json"
        rows={Math.min(12, Math.max(2, text.split("\n").length))}
        value={text}
        onInput={(event) => {
          const next = event.currentTarget.value
          setText(next)
          if (next.trim() === "") {
            setProblem(undefined)
            return onChange(undefined)
          }
          try {
            onChange(JSON.parse(next))
            setProblem(undefined)
          } catch (error) {
            setProblem(String(error))
          }
        }}
      />
      {problem !== undefined && <span class="error">{problem}</span>}
    </>
  )
}

/** One field of a request: an input of its kind; `undefined` leaves it out of the request. */
const FieldInput = ({
  name,
  kind,
  value,
  onChange
}: {
  readonly name: string
  readonly kind: FieldKind
  readonly value: unknown
  readonly onChange: (value: unknown) => void
}) => {
  const [problem, setProblem] = useState<string | undefined>(undefined)
  switch (kind._tag) {
    case "enum":
      return (
        <select
          id={`field-${name}`}
          name={name}
          value={value === undefined ? "" : JSON.stringify(value)}
          onChange={(event) => {
            const chosen = event.currentTarget.value
            onChange(chosen === "" ? undefined : JSON.parse(chosen))
          }}
        >
          <option value="">(default)</option>
          {kind.values.map((option) => (
            <option key={String(option)} value={JSON.stringify(option)}>
              {String(option)}
            </option>
          ))}
        </select>
      )
    case "boolean":
      return (
        <input
          type="checkbox"
          id={`field-${name}`}
          name={name}
          checked={value === true}
          onChange={(event) => onChange(event.currentTarget.checked)}
        />
      )
    case "number":
      return (
        <input
          type="number"
          id={`field-${name}`}
          name={name}
          step={kind.integer ? 1 : "any"}
          {...(kind.min === undefined ? {} : { min: kind.min })}
          {...(kind.max === undefined ? {} : { max: kind.max })}
          value={typeof value === "number" ? value : ""}
          onInput={(event) => {
            const text = event.currentTarget.value
            onChange(text === "" ? undefined : Number(text))
          }}
        />
      )
    case "string": {
      const isDataUrl = typeof value === "string" && value.startsWith("data:") && value.length > 200
      return (
        <span class="string-field">
          {isDataUrl ? (
            <span class="data-url">
              {dataUrlSummary(value)}
              <button type="button" onClick={() => onChange(undefined)}>
                Clear
              </button>
            </span>
          ) : kind.long ? (
            <textarea
              id={`field-${name}`}
              name={name}
              rows={2}
              value={typeof value === "string" ? value : ""}
              onInput={(event) => onChange(event.currentTarget.value === "" ? undefined : event.currentTarget.value)}
            />
          ) : (
            <input
              type="text"
              id={`field-${name}`}
              name={name}
              value={typeof value === "string" ? value : ""}
              onInput={(event) => onChange(event.currentTarget.value === "" ? undefined : event.currentTarget.value)}
            />
          )}
          {kind.media && (
            <input
              type="file"
              name={`${name}-file`}
              accept="image/*,audio/*,video/*"
              onChange={(event) => {
                const file = event.currentTarget.files?.[0]
                if (file === undefined) return
                dataUrlOf(file).then(
                  (url) => {
                    setProblem(undefined)
                    onChange(url)
                  },
                  (error: unknown) => setProblem(String(error))
                )
              }}
            />
          )}
          {problem !== undefined && <span class="error">{problem}</span>}
        </span>
      )
    }
    case "json":
      return <JsonField id={`field-${name}`} value={value} onChange={onChange} />
  }
}

const Fields = ({
  document,
  shape,
  names,
  body,
  setField
}: {
  readonly document: AppDocument
  readonly shape: RequestShape
  readonly names: ReadonlyArray<string>
  readonly body: Record<string, unknown>
  readonly setField: (name: string, value: unknown) => void
}) => (
  <div class="fields">
    {shape.properties
      .filter(([name]) => names.includes(name))
      .map(([name, schema]) => {
        const example = isRecord(shape.example) ? shape.example[name] : undefined
        const description = isRecord(schema) && typeof schema.description === "string" ? schema.description : undefined
        return (
          <div key={name} class="field">
            <label class="field-name" for={`field-${name}`}>
              {name}
              {shape.required.has(name) ? " *" : ""}
            </label>
            <FieldInput
              name={name}
              kind={fieldKind(document, name, schema, example)}
              value={body[name]}
              onChange={(value) => setField(name, value)}
            />
            {description !== undefined && <span class="hint">{clipped(description, 200)}</span>}
          </div>
        )
      })}
  </div>
)

/** Sends a request and follows its answer; stops it when the component goes. */
const useAsk = () => {
  const [answer, setAnswer] = useState<AnswerState | undefined>(undefined)
  const running = useRef<AbortController | undefined>(undefined)
  useEffect(() => () => running.current?.abort(), [])
  const send = async (appId: string, transport: Transport, body: unknown) => {
    running.current?.abort()
    const abort = new AbortController()
    running.current = abort
    return ask(
      appId,
      transport,
      body,
      (state) => {
        if (running.current === abort) setAnswer(state)
      },
      abort.signal
    )
  }
  const stop = () => running.current?.abort()
  return { answer, send, stop, setAnswer }
}

const GenericPlayground = ({
  appId,
  document,
  shape
}: {
  readonly appId: string
  readonly document: AppDocument
  readonly shape: RequestShape
}) => {
  const initial = isRecord(shape.example) ? shape.example : {}
  const [body, setBody] = useState<Record<string, unknown>>(initial)
  const [mode, setMode] = useState<"form" | "json">(shape.properties.length === 0 ? "json" : "form")
  const [jsonText, setJsonText] = useState(JSON.stringify(shape.example ?? {}, null, 2))
  const [problem, setProblem] = useState<string | undefined>(undefined)
  const { answer, send, stop } = useAsk()
  const parsedJson = (): unknown => {
    try {
      setProblem(undefined)
      return JSON.parse(jsonText)
    } catch (error) {
      setProblem(`the request is not JSON: ${String(error)}`)
      return undefined
    }
  }
  const switchTo = (next: "form" | "json") => {
    if (next === mode) return
    if (next === "json") {
      setJsonText(JSON.stringify(body, null, 2))
      setMode("json")
      return
    }
    const parsed = parsedJson()
    if (!isRecord(parsed)) return setProblem("the form shows a request that is a JSON object")
    setBody(parsed)
    setMode("form")
  }
  const submit = (event: Event) => {
    event.preventDefault()
    const request = mode === "json" ? parsedJson() : body
    if (request === undefined) return
    void send(appId, "invoke", request)
  }
  return (
    <div class="generic">
      <form class="request panel" onSubmit={submit}>
        <div class="tabs">
          <button type="button" class={mode === "form" ? "active" : ""} onClick={() => switchTo("form")}>
            Form
          </button>
          <button type="button" class={mode === "json" ? "active" : ""} onClick={() => switchTo("json")}>
            JSON
          </button>
          <span class="hint">POST {routeOf(appId, "invoke")}</span>
        </div>
        {mode === "form" ? (
          <Fields
            document={document}
            shape={shape}
            names={shape.properties.map(([name]) => name)}
            body={body}
            setField={(name, value) =>
              setBody((current) => {
                const { [name]: _, ...rest } = current
                return value === undefined ? rest : { ...rest, [name]: value }
              })
            }
          />
        ) : (
          <textarea
            class="json request-json"
            rows={14}
            value={jsonText}
            onInput={(event) => setJsonText(event.currentTarget.value)}
          />
        )}
        {problem !== undefined && <p class="error">{problem}</p>}
        <div class="buttons">
          <button type="submit" class="primary">
            Send
          </button>
          {answer !== undefined && !answer.done && (
            <button type="button" onClick={stop}>
              Stop
            </button>
          )}
          <button
            type="button"
            onClick={() => {
              setBody(initial)
              setJsonText(JSON.stringify(shape.example ?? {}, null, 2))
            }}
          >
            Example
          </button>
        </div>
      </form>
      {answer !== undefined && (
        <section class="panel">
          <h3>Answer</h3>
          <AnswerView state={answer} />
        </section>
      )}
    </div>
  )
}

interface Attachment {
  readonly kind: "image" | "audio"
  readonly name: string
  readonly url: string
}

type ChatMessage = { readonly role: string; readonly content: unknown }

interface Turn {
  readonly role: "user" | "assistant"
  readonly text: string
  readonly attachments: ReadonlyArray<Attachment>
  readonly answer?: AnswerState
}

/** A content part of OpenAI's chat for an attachment: wav and mp3 as `input_audio`, other audio by URL. */
const partOf = (attachment: Attachment): unknown => {
  if (attachment.kind === "image") return { type: "image_url", image_url: { url: attachment.url } }
  const audio = /^data:audio\/(wav|x-wav|wave|mpeg|mp3);base64,(.*)$/s.exec(attachment.url)
  return audio === null
    ? { type: "audio_url", audio_url: { url: attachment.url } }
    : { type: "input_audio", input_audio: { data: audio[2], format: audio[1]!.includes("mp") ? "mp3" : "wav" } }
}

/** The example's last user message, as the composer's text and attachments; the messages before it. */
const composerOf = (example: unknown) => {
  const messages = isRecord(example) && Array.isArray(example.messages) ? (example.messages as Array<unknown>) : []
  const last = messages.at(-1)
  const before = messages.slice(0, -1).filter(isRecord) as Array<ChatMessage>
  if (!isRecord(last) || last.role !== "user") return { history: [...before], text: "", attachments: [] }
  if (typeof last.content === "string") return { history: before, text: last.content, attachments: [] }
  let text = ""
  const attachments: Array<Attachment> = []
  for (const part of Array.isArray(last.content) ? last.content : []) {
    if (!isRecord(part)) continue
    if (part.type === "text" && typeof part.text === "string") text += part.text
    if (part.type === "image_url" && isRecord(part.image_url) && typeof part.image_url.url === "string")
      attachments.push({ kind: "image", name: "example image", url: part.image_url.url })
    if (part.type === "audio_url" && isRecord(part.audio_url) && typeof part.audio_url.url === "string")
      attachments.push({ kind: "audio", name: "example audio", url: part.audio_url.url })
    if (part.type === "input_audio" && isRecord(part.input_audio) && typeof part.input_audio.data === "string")
      attachments.push({
        kind: "audio",
        name: "example audio",
        url: `data:audio/${part.input_audio.format === "mp3" ? "mpeg" : "wav"};base64,${part.input_audio.data}`
      })
  }
  return { history: before, text, attachments }
}

/** Request fields beside the messages that the chat shows: choices, and those the example sets. */
const chatFieldNames = (document: AppDocument, shape: RequestShape) =>
  shape.properties
    .filter(([name, schema]) => {
      if (name === "messages" || name === "stream" || name === "stream_options") return false
      const inExample = isRecord(shape.example) && shape.example[name] !== undefined
      return inExample || shape.required.has(name) || fieldKind(document, name, schema, undefined)._tag === "enum"
    })
    .map(([name]) => name)

const AttachmentView = ({
  attachment,
  onRemove
}: {
  readonly attachment: Attachment
  readonly onRemove?: () => void
}) => (
  <span class={`attachment ${attachment.kind}`}>
    {attachment.kind === "image" ? <img class="thumb" src={attachment.url} alt={attachment.name} /> : <span>♪</span>}
    <span class="name">{clipped(attachment.name, 40)}</span>
    {onRemove !== undefined && (
      <button type="button" class="remove" title="Remove" onClick={onRemove}>
        ×
      </button>
    )}
  </span>
)

const ChatPlayground = ({
  appId,
  document,
  shape
}: {
  readonly appId: string
  readonly document: AppDocument
  readonly shape: RequestShape
}) => {
  const start = composerOf(shape.example)
  const openAi = hasOpenAiChat(document, appId)
  const fieldNames = chatFieldNames(document, shape)
  const initialFields = Object.fromEntries(
    fieldNames.flatMap((name) =>
      isRecord(shape.example) && shape.example[name] !== undefined ? [[name, shape.example[name]]] : []
    )
  )
  const [fields, setFields] = useState<Record<string, unknown>>(initialFields)
  const [transport, setTransport] = useState<Transport>(openAi ? "openai-chat" : "invoke")
  const [history, setHistory] = useState<ReadonlyArray<ChatMessage>>(start.history)
  const [turns, setTurns] = useState<ReadonlyArray<Turn>>([])
  const [text, setText] = useState(start.text)
  const [attachments, setAttachments] = useState<ReadonlyArray<Attachment>>(start.attachments)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  const { answer, send, stop, setAnswer } = useAsk()
  const busy = answer !== undefined && !answer.done

  const attach = async (files: FileList | null) => {
    for (const file of Array.from(files ?? [])) {
      const kind = file.type.startsWith("audio/") ? "audio" : file.type.startsWith("image/") ? "image" : undefined
      if (kind === undefined) {
        setProblem(`${file.name} is neither an image nor audio`)
        continue
      }
      try {
        const url = await dataUrlOf(file)
        setAttachments((current) => [...current, { kind, name: file.name, url }])
        setProblem(undefined)
      } catch (error) {
        setProblem(String(error))
      }
    }
  }

  const submit = async (event: Event) => {
    event.preventDefault()
    if (busy || (text.trim() === "" && attachments.length === 0)) return
    const content =
      attachments.length === 0 ? text : [...(text === "" ? [] : [{ type: "text", text }]), ...attachments.map(partOf)]
    const message: ChatMessage = { role: "user", content }
    const messages = [...history, message]
    const body = { ...fields, messages, ...(transport === "openai-chat" ? { stream: true } : {}) }
    const userTurn: Turn = { role: "user", text, attachments }
    setTurns((current) => [...current, userTurn])
    setText("")
    setAttachments([])
    const ended = await send(appId, transport, body)
    setAnswer(undefined)
    setTurns((current) => [...current, { role: "assistant", text: "", attachments: [], answer: ended }])
    // The conversation goes on from a turn that was answered; a refused one can be sent again.
    if (ended.refusal === undefined) {
      const reply = replyTextOf(ended.values)
      setHistory([...messages, ...(reply === undefined ? [] : [{ role: "assistant", content: reply }])])
    }
  }

  return (
    <div class="chat">
      <section class="panel conversation">
        {turns.length === 0 && answer === undefined && (
          <p class="hint">Ask something; attach an image or a sound. The example's message is ready below.</p>
        )}
        {turns.map((turn, index) => (
          <div key={index} class={`turn ${turn.role}`}>
            {turn.role === "user" ? (
              <>
                {turn.text !== "" && <p>{turn.text}</p>}
                <div class="attachments">
                  {turn.attachments.map((attachment, at) => (
                    <AttachmentView key={at} attachment={attachment} />
                  ))}
                </div>
              </>
            ) : (
              turn.answer !== undefined && <AnswerView state={turn.answer} />
            )}
          </div>
        ))}
        {answer !== undefined && (
          <div class="turn assistant pending">
            <AnswerView state={answer} />
          </div>
        )}
      </section>
      <form class="panel composer" onSubmit={(event) => void submit(event)}>
        <textarea
          name="message"
          rows={3}
          placeholder="Message"
          value={text}
          onInput={(event) => setText(event.currentTarget.value)}
          onKeyDown={(event) => {
            if (event.key === "Enter" && !event.shiftKey) void submit(event)
          }}
        />
        <div class="attachments">
          {attachments.map((attachment, index) => (
            <AttachmentView
              key={`${index}-${attachment.name}`}
              attachment={attachment}
              onRemove={() => setAttachments((current) => current.filter((_, at) => at !== index))}
            />
          ))}
        </div>
        <div class="buttons">
          <label class="file-button">
            Attach image or audio
            <input
              type="file"
              class="attach"
              name="attach"
              accept="image/*,audio/*"
              multiple
              onChange={(event) => {
                const input = event.currentTarget
                void attach(input.files).then(() => {
                  input.value = ""
                })
              }}
            />
          </label>
          <button type="submit" class="primary" disabled={busy}>
            Send
          </button>
          {busy && (
            <button type="button" onClick={stop}>
              Stop
            </button>
          )}
          <button
            type="button"
            onClick={() => {
              setHistory(start.history)
              setTurns([])
              setText(start.text)
              setAttachments(start.attachments)
            }}
          >
            New chat
          </button>
        </div>
        {problem !== undefined && <p class="error">{problem}</p>}
        {fieldNames.length > 0 && (
          <Fields
            document={document}
            shape={shape}
            names={fieldNames}
            body={fields}
            setField={(name, value) =>
              setFields((current) => {
                const { [name]: _, ...rest } = current
                return value === undefined ? rest : { ...rest, [name]: value }
              })
            }
          />
        )}
        <div class="fields">
          <label class="field">
            <span class="field-name">route</span>
            <select
              name="route"
              value={transport}
              onChange={(event) => setTransport(event.currentTarget.value as Transport)}
            >
              {openAi && <option value="openai-chat">OpenAI's chat, streamed (SSE)</option>}
              <option value="invoke">the app's own route (JSON or NDJSON)</option>
            </select>
            <span class="hint">POST {routeOf(appId, transport)}</span>
          </label>
        </div>
        <details>
          <summary>Conversation so far, as sent</summary>
          <pre>{shownJson({ ...fields, messages: history }, 2)}</pre>
        </details>
      </form>
    </div>
  )
}

export const PlaygroundPage = ({ appId }: { readonly appId: string }) => {
  const [apps, setApps] = useState<ReadonlyArray<AppSummary>>([])
  const [document, setDocument] = useState<AppDocument | undefined>(undefined)
  const [refusal, setRefusal] = useState<Refusal | undefined>(undefined)
  const [attempt, setAttempt] = useState(0)
  useEffect(() => {
    const abort = new AbortController()
    void getJson<AppListJson>("/app/list", "none", abort.signal).then((listed) => {
      if (listed.ok) setApps(listed.value.apps)
    })
    return () => abort.abort()
  }, [])
  useEffect(() => {
    setDocument(undefined)
    setRefusal(undefined)
    if (appId === "") return
    const abort = new AbortController()
    void getJson<AppDocument>(`/app/${encodeURIComponent(appId)}/openapi.json`, "apiKey", abort.signal).then(
      (answer) => {
        if (abort.signal.aborted) return
        if (answer.ok) setDocument(answer.value)
        else setRefusal(answer.refusal)
      }
    )
    return () => abort.abort()
  }, [appId, attempt])
  const shape = document === undefined ? undefined : requestShape(document, appId)
  return (
    <div class="page playground">
      <section class="panel app-picker">
        <label>
          App{" "}
          <select
            name="app"
            value={appId}
            onChange={(event) => {
              location.hash = `#/play/${encodeURIComponent(event.currentTarget.value)}`
            }}
          >
            {appId === "" && <option value="">(choose an app)</option>}
            {apps.map((app) => (
              <option key={app.id} value={app.id}>
                {app.id} ({app.state})
              </option>
            ))}
          </select>
        </label>
        {document?.info?.description !== undefined && (
          <p class="description">{clipped(document.info.description, 500)}</p>
        )}
        {appId !== "" && (
          <a href={`/app/${encodeURIComponent(appId)}/docs`} class="hint">
            API docs
          </a>
        )}
      </section>
      {refusal !== undefined && <RefusalNotice refusal={refusal} onRetry={() => setAttempt((value) => value + 1)} />}
      {document !== undefined &&
        shape !== undefined &&
        (isChatRequest(shape) ? (
          <ChatPlayground key={appId} appId={appId} document={document} shape={shape} />
        ) : (
          <GenericPlayground key={appId} appId={appId} document={document} shape={shape} />
        ))}
    </div>
  )
}
