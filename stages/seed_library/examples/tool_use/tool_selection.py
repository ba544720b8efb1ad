# spade: domain=tool_use skill=tool-selection
class MessageDeskEnv(ToolUseBaseEnv):
    max_turns = 8

    def setup(self):
        r = self.rng
        chans = ["general", "ops", "sales"]
        ppl = r.sample("Ana Ben Cai Dev Eli".split(), 2)
        who = [("send_sms", ppl[0]), ("post_chat", r.choice(chans)), ("send_sms", ppl[1])]
        asks = [[t, w, f"Call at {r.randint(9, 17)}:00."] for t, w in who]
        r.shuffle(asks)
        self.state = {"known": ppl + chans, "asks": asks, "sent": []}
        self.tools = {
            "send_sms": {"description": "Text a contact.", "parameters": {
                "type": "object", "properties": {
                    "to": {"type": "string"}, "text": {"type": "string"}}}},
            "post_chat": {"description": "Post in a team channel.", "parameters": {
                "type": "object", "properties": {
                    "to": {"type": "string", "enum": chans}, "text": {"type": "string"}}}},
            "send_fax": {"description": "Fax a page to a number.", "parameters": {
                "type": "object", "properties": {"number": {"type": "string"}}}},
        }
        say = {"send_sms": 'Text {}: "{}"', "post_chat": 'Post in #{}: "{}"'}
        self.instructions = [say[t].format(w, x) for t, w, x in asks]
        self.criteria = [lambda s, a=a: a in s["sent"] for a in asks]

    def deliver(self, tool, to, text):
        if to not in self.state["known"]:
            return f"Error: unknown recipient {to}."
        self.state["sent"].append([tool, to, text])
        return "Sent."

    def tool_send_sms(self, to, text):
        return self.deliver("send_sms", to, text)

    def tool_post_chat(self, to, text):
        return self.deliver("post_chat", to, text)

    def tool_send_fax(self, number):
        return "Faxed."

    def solution(self):
        acts = [self.call(t, to=w, text=x) for t, w, x in self.state["asks"]]
        return acts + [self.finish()]
