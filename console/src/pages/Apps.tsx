import { useEffect, useState } from "preact/hooks"
import type { AppListJson } from "../../../src/control/gateway/GatewayAnswers"
import { call, getJson, lines, type Refusal, refusalOf } from "../api"
import { clipped, formatMs, RefusalNotice, usePolling } from "../components"

/** An app as `GET /app/list` lists it. */
export type AppSummary = AppListJson["apps"][number]

/** An app file's size the page sends: the gateway bounds its bodies too; this says so before sending. */
const maxSourceBytes = 8 * 1024 * 1024

const limitsOf = (app: AppSummary) => {
  const parts: Array<string> = []
  if (app.admission !== undefined) {
    parts.push(`${app.admission.maxConcurrency} at once`, `queue ${app.admission.maxQueue}`)
    parts.push(`wait ≤ ${formatMs(app.admission.queueTimeoutMs)}`)
  } else parts.push("no admission limit")
  if (app.timeoutMs !== undefined) parts.push(`timeout ${formatMs(app.timeoutMs)}`)
  return parts.join(", ")
}

type Registration =
  | { readonly _tag: "Idle" }
  | { readonly _tag: "Running"; readonly log: ReadonlyArray<string> }
  | { readonly _tag: "Done"; readonly log: ReadonlyArray<string> }
  | { readonly _tag: "Failed"; readonly log: ReadonlyArray<string>; readonly refusal: Refusal }

const RegisterForm = ({ preset, onRegistered }: { readonly preset: string; readonly onRegistered: () => void }) => {
  const [file, setFile] = useState<File | undefined>(undefined)
  const [name, setName] = useState(preset)
  const [replace, setReplace] = useState(preset !== "")
  const [keys, setKeys] = useState("")
  const [state, setState] = useState<Registration>({ _tag: "Idle" })
  // "Replace" on an app's row names it here.
  useEffect(() => {
    if (preset === "") return
    setName(preset)
    setReplace(true)
  }, [preset])

  const register = async () => {
    if (file === undefined || name.trim() === "") return
    const failed = (log: ReadonlyArray<string>, refusal: Refusal) => setState({ _tag: "Failed", log, refusal })
    if (file.size > maxSourceBytes)
      return failed([], { status: 0, code: "TooLarge", message: `${file.name} is larger than 8 MiB` })
    const source = await file.text()
    const apiKeys = keys.split(/[\s,]+/).filter((key) => key !== "")
    let log: Array<string> = []
    setState({ _tag: "Running", log })
    const sent = await call("/app/register", {
      body: { source, name: name.trim(), replace, ...(apiKeys.length === 0 ? {} : { apiKeys }) },
      auth: "admin"
    })
    if (!sent.ok) return failed(log, sent.refusal)
    // Server-Sent Events: `progress`, then `final` or `error`.
    let event = "message"
    try {
      for await (const line of lines(sent.value, 4 * 1024 * 1024, 1024 * 1024)) {
        if (line.startsWith("event: ")) event = line.slice("event: ".length)
        if (!line.startsWith("data: ")) continue
        const data = line.slice("data: ".length)
        const message = (() => {
          try {
            const parsed = JSON.parse(data) as { message?: unknown }
            return typeof parsed.message === "string" ? parsed.message : undefined
          } catch {
            return undefined
          }
        })()
        if (event === "error") return failed(log, refusalOf(500, data))
        log = [...log, clipped(message ?? data)]
        if (event === "final") {
          setState({ _tag: "Done", log })
          onRegistered()
          return
        }
        setState({ _tag: "Running", log })
      }
    } catch (error) {
      return failed(log, { status: 0, code: "Broken", message: String(error) })
    }
    failed(log, { status: 0, code: "Broken", message: "the gateway closed the registration without an outcome" })
  }

  return (
    <section class="panel register" id="register">
      <h2>{replace ? "Replace an app" : "Register an app"}</h2>
      <form
        onSubmit={(event) => {
          event.preventDefault()
          void register()
        }}
      >
        <label>
          App file (.ts)
          <input
            type="file"
            name="app-file"
            accept=".ts,.mts,.js,.mjs"
            onChange={(event) => {
              const chosen = event.currentTarget.files?.[0]
              setFile(chosen)
              if (chosen !== undefined && (name === "" || !replace))
                setName(chosen.name.replace(/\.(m?ts|m?js)$/, "").replace(/[^a-zA-Z0-9_-]/g, "_"))
            }}
          />
        </label>
        <label>
          Name
          <input type="text" name="app-name" value={name} onInput={(event) => setName(event.currentTarget.value)} />
        </label>
        <label class="inline">
          <input
            type="checkbox"
            name="replace"
            checked={replace}
            onChange={(event) => setReplace(event.currentTarget.checked)}
          />
          replace the app of that name
        </label>
        <label>
          API keys of its own (optional, space-separated)
          <input
            type="password"
            name="api-keys"
            autocomplete="off"
            value={keys}
            onInput={(event) => setKeys(event.currentTarget.value)}
          />
        </label>
        <button type="submit" disabled={file === undefined || name.trim() === "" || state._tag === "Running"}>
          {replace ? "Replace" : "Register"}
        </button>
      </form>
      <p class="hint">
        The file is sent as it is: an app that imports only <code>cornserve/app</code>, <code>effect</code> and Node's
        modules. One that imports npm packages is registered with the CLI, which bundles them.
      </p>
      {state._tag !== "Idle" && (
        <div class={`registration ${state._tag.toLowerCase()}`}>
          <ul class="log">
            {state.log.map((line, index) => (
              <li key={index}>{line}</li>
            ))}
            {state._tag === "Running" && <li class="pending">registering…</li>}
          </ul>
          {state._tag === "Failed" && <RefusalNotice refusal={state.refusal} onRetry={() => void register()} />}
        </div>
      )}
    </section>
  )
}

const UnregisterButton = ({ appId, onDone }: { readonly appId: string; readonly onDone: () => void }) => {
  const [asking, setAsking] = useState(false)
  const [refusal, setRefusal] = useState<Refusal | undefined>(undefined)
  const unregister = async () => {
    setAsking(false)
    const sent = await call(`/app/unregister/${encodeURIComponent(appId)}`, { method: "POST", body: {}, auth: "admin" })
    if (!sent.ok) return setRefusal(sent.refusal)
    setRefusal(undefined)
    onDone()
  }
  return (
    <span class="unregister">
      {asking ? (
        <>
          <button type="button" class="danger" onClick={() => void unregister()}>
            Unregister {appId}?
          </button>
          <button type="button" onClick={() => setAsking(false)}>
            Keep
          </button>
        </>
      ) : (
        <button type="button" onClick={() => setAsking(true)}>
          Unregister
        </button>
      )}
      {refusal !== undefined && <RefusalNotice refusal={refusal} onRetry={() => void unregister()} />}
    </span>
  )
}

export const AppsPage = () => {
  const [apps, setApps] = useState<ReadonlyArray<AppSummary> | undefined>(undefined)
  const [refusal, setRefusal] = useState<Refusal | undefined>(undefined)
  const [replacing, setReplacing] = useState("")
  const [tick, setTick] = useState(0)
  usePolling(
    async (signal) => {
      const listed = await getJson<AppListJson>("/app/list", "none", signal)
      if (signal.aborted) return
      if (!listed.ok) return setRefusal(listed.refusal)
      setRefusal(undefined)
      setApps(listed.value.apps)
    },
    2000,
    tick
  )
  const refresh = () => setTick((value) => value + 1)
  return (
    <div class="page apps">
      <section class="panel">
        <h2>Apps</h2>
        {refusal !== undefined && <RefusalNotice refusal={refusal} onRetry={refresh} />}
        {apps === undefined ? (
          <p>Loading…</p>
        ) : apps.length === 0 ? (
          <p>No app is registered.</p>
        ) : (
          <table class="apps-table">
            <thead>
              <tr>
                <th>App</th>
                <th>State</th>
                <th>Tasks</th>
                <th>In flight</th>
                <th>Queued</th>
                <th>Limits</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {apps.map((app) => (
                <tr key={app.id} data-app={app.id}>
                  <td>
                    <a class="app-id" href={`#/play/${encodeURIComponent(app.id)}`}>
                      {app.id}
                    </a>
                    {app.description !== undefined && <div class="description">{clipped(app.description, 200)}</div>}
                    {app.error !== undefined && <div class="error">{clipped(app.error, 500)}</div>}
                  </td>
                  <td>
                    <span class={`state state-${app.state}`}>{app.state}</span>
                  </td>
                  <td>{app.tasks.length === 0 ? "—" : app.tasks.map((task) => task.name).join(", ")}</td>
                  <td class="number">{app.inFlight}</td>
                  <td class="number">{app.queued ?? 0}</td>
                  <td>{limitsOf(app)}</td>
                  <td class="actions">
                    <a href={`#/play/${encodeURIComponent(app.id)}`}>Try</a>
                    <a href={`/app/${encodeURIComponent(app.id)}/docs`}>Docs</a>
                    <button
                      type="button"
                      onClick={() => {
                        setReplacing(app.id)
                        document.getElementById("register")?.scrollIntoView()
                      }}
                    >
                      Replace
                    </button>
                    <UnregisterButton appId={app.id} onDone={refresh} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </section>
      <RegisterForm preset={replacing} onRegistered={refresh} />
    </div>
  )
}
