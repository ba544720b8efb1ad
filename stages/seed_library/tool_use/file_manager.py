# spade: domain=tool_use skill=tool-selection
"""Shared drive: file requests where similar tools do different things (move vs copy, append vs
overwrite, trash vs permanent delete). Picking the wrong one leaves the drive in the wrong state."""

import json

PROJECTS = ["apollo", "borealis", "cascade", "dynamo", "equinox", "falcon", "granite"]
REPORTS = ["q3_report", "budget_forecast", "user_survey", "incident_review", "vendor_audit",
           "release_notes", "market_scan"]
PEOPLE = ["Noor", "Felix", "Ingrid", "Kofi", "Mei", "Tariq", "Wanda"]
EXTRA = ["meeting_notes", "todo", "contacts", "travel_plan", "ideas", "invoice_0412"]


class FileManagerEnv(ToolUseBaseEnv):
    max_turns = 12

    def setup(self):
        rng = self.rng
        project, other = rng.sample(PROJECTS, 2)
        report = rng.choice(REPORTS)
        new_name = f"{project}_{report}_final.txt"
        reviewer = rng.choice(PEOPLE)
        extras = rng.sample(EXTRA, 3)
        draft = f"draft_{rng.choice(['v1', 'v2', 'old', 'scratch'])}.txt"
        body = f"{report.replace('_', ' ').title()}\nOwner: {rng.choice(PEOPLE)}\n" \
               f"Figures: {rng.randint(10, 99)}, {rng.randint(100, 999)}\n"
        log = f"# {project} changelog\n- project created\n"
        files = {
            f"/inbox/{report}.txt": body,
            f"/inbox/{extras[0]}.txt": f"{extras[0]} contents\n",
            f"/inbox/{extras[1]}.txt": f"{extras[1]} contents\n",
            f"/projects/{project}/CHANGELOG.md": log,
            f"/projects/{project}/{draft}": "unfinished draft\n",
            f"/projects/{project}/plan.txt": "milestones\n",
            f"/projects/{other}/{report}.txt": "an older, unrelated report\n",
            f"/projects/{other}/{extras[2]}.txt": f"{extras[2]} contents\n",
        }
        dirs = {"/", "/inbox", "/projects", f"/projects/{project}", f"/projects/{other}",
                "/archive", "/trash"}
        self.state = {"files": files, "dirs": sorted(dirs)}
        pdir = f"/projects/{project}"
        line = f"- added {new_name} (reviewed by {reviewer})"
        self.instructions = [
            f"Move {report}.txt out of /inbox and into the {project} project folder "
            "(no copy should stay behind).",
            f"Rename it in that folder to {new_name}.",
            f"Remove {draft} from the {project} folder, but put it in the trash instead of "
            "deleting it permanently.",
            f"Add the line '{line}' at the end of the {project} CHANGELOG.md, keeping "
            "everything already in it.",
        ]

        def filed(s, name):
            return s["files"].get(f"{pdir}/{name}") == body

        self.criteria = [
            lambda s: f"/inbox/{report}.txt" not in s["files"]
            and (filed(s, f"{report}.txt") or filed(s, new_name)),
            lambda s: filed(s, new_name) and f"{pdir}/{report}.txt" not in s["files"],
            lambda s: s["files"].get(f"/trash/{draft}") == "unfinished draft\n"
            and f"{pdir}/{draft}" not in s["files"],
            lambda s: s["files"].get(f"{pdir}/CHANGELOG.md", "").rstrip("\n") == log + line,
        ]
        self._plan = [
            ("list_dir", {"path": "/inbox"}),
            ("move_file", {"path": f"/inbox/{report}.txt", "to_dir": pdir}),
            ("rename_file", {"path": f"{pdir}/{report}.txt", "new_name": new_name}),
            ("delete_file", {"path": f"{pdir}/{draft}", "mode": "trash"}),
            ("read_file", {"path": f"{pdir}/CHANGELOG.md"}),
            ("append_to_file", {"path": f"{pdir}/CHANGELOG.md", "text": line}),
        ]
        path = {"type": "string", "description": "absolute path, e.g. /inbox/a.txt"}
        self.tools = {
            "list_dir": {"description": "List the files and folders directly inside a folder.",
                         "parameters": {"type": "object", "properties": {"path": path},
                                        "required": ["path"]}},
            "read_file": {"description": "Return the text of a file.",
                          "parameters": {"type": "object", "properties": {"path": path},
                                         "required": ["path"]}},
            "move_file": {"description": "Move a file into another folder (the original is "
                                         "removed).",
                          "parameters": {"type": "object",
                                         "properties": {"path": path, "to_dir": path},
                                         "required": ["path", "to_dir"]}},
            "copy_file": {"description": "Copy a file into another folder (the original stays).",
                          "parameters": {"type": "object",
                                         "properties": {"path": path, "to_dir": path},
                                         "required": ["path", "to_dir"]}},
            "rename_file": {"description": "Give a file a new name in the same folder.",
                            "parameters": {"type": "object",
                                           "properties": {"path": path,
                                                          "new_name": {"type": "string"}},
                                           "required": ["path", "new_name"]}},
            "append_to_file": {"description": "Add one line of text at the end of a file.",
                               "parameters": {"type": "object",
                                              "properties": {"path": path,
                                                             "text": {"type": "string"}},
                                              "required": ["path", "text"]}},
            "write_file": {"description": "Replace the whole content of a file (creates it if "
                                          "missing).",
                           "parameters": {"type": "object",
                                          "properties": {"path": path,
                                                         "content": {"type": "string"}},
                                          "required": ["path", "content"]}},
            "delete_file": {"description": "Delete a file, either into /trash or permanently.",
                            "parameters": {"type": "object",
                                           "properties": {"path": path,
                                                          "mode": {"type": "string",
                                                                   "enum": ["trash",
                                                                            "permanent"]}},
                                           "required": ["path", "mode"]}},
        }

    # -- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _norm(path):
        text = "/" + "/".join(p for p in str(path).strip().split("/") if p)
        return text

    def _file(self, path):
        path = self._norm(path)
        if path not in self.state["files"]:
            raise ValueError(f"no such file: {path}")
        return path

    def _dir(self, path):
        path = self._norm(path)
        if path not in self.state["dirs"]:
            raise ValueError(f"no such folder: {path}")
        return path

    @staticmethod
    def _name(path):
        return path.rsplit("/", 1)[-1]

    # -- tools --------------------------------------------------------------------------------
    def tool_list_dir(self, path):
        folder = self._dir(path)
        prefix = folder.rstrip("/") + "/"
        names = set()
        for p in list(self.state["files"]) + self.state["dirs"]:
            if p.startswith(prefix) and p != folder:
                rest = p[len(prefix):]
                names.add(rest.split("/")[0] + ("/" if "/" in rest or p in self.state["dirs"]
                                                else ""))
        return json.dumps(sorted(names))

    def tool_read_file(self, path):
        return self.state["files"][self._file(path)]

    def tool_move_file(self, path, to_dir):
        src, folder = self._file(path), self._dir(to_dir)
        dst = folder.rstrip("/") + "/" + self._name(src)
        if dst == src:
            return "Error: the file is already in that folder."
        if dst in self.state["files"]:
            return f"Error: {dst} already exists."
        self.state["files"][dst] = self.state["files"].pop(src)
        return f"Moved {src} -> {dst}"

    def tool_copy_file(self, path, to_dir):
        src, folder = self._file(path), self._dir(to_dir)
        dst = folder.rstrip("/") + "/" + self._name(src)
        if dst in self.state["files"]:
            return f"Error: {dst} already exists."
        self.state["files"][dst] = self.state["files"][src]
        return f"Copied {src} -> {dst}"

    def tool_rename_file(self, path, new_name):
        src = self._file(path)
        new_name = str(new_name).strip()
        if not new_name or "/" in new_name:
            return "Error: new_name must be a plain file name without '/'."
        dst = src.rsplit("/", 1)[0] + "/" + new_name
        if dst in self.state["files"]:
            return f"Error: {dst} already exists."
        self.state["files"][dst] = self.state["files"].pop(src)
        return f"Renamed {src} -> {dst}"

    def tool_append_to_file(self, path, text):
        target = self._file(path)
        content = self.state["files"][target]
        if content and not content.endswith("\n"):
            content += "\n"
        self.state["files"][target] = content + str(text).rstrip("\n") + "\n"
        return f"Appended 1 line to {target}."

    def tool_write_file(self, path, content):
        target = self._norm(path)
        self._dir(target.rsplit("/", 1)[0] or "/")
        self.state["files"][target] = str(content)
        return f"Wrote {len(str(content))} characters to {target}."

    def tool_delete_file(self, path, mode):
        target = self._file(path)
        if mode not in ("trash", "permanent"):
            return "Error: mode must be 'trash' or 'permanent'."
        content = self.state["files"].pop(target)
        if mode == "trash":
            self.state["files"]["/trash/" + self._name(target)] = content
            return f"Moved {target} to /trash."
        return f"Deleted {target} permanently."

    def solution(self):
        return [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                for n, a in self._plan] + ["<answer>done</answer>"]
