# spade: domain=tool_use skill=error-recovery
class PaymentFixEnv(ToolUseBaseEnv):
    max_turns = 12

    def setup(self):
        r = self.rng
        ids = [f"AC{n}" for n in r.sample(range(1000, 10000), 6)]
        names = r.sample("Ana Ben Cai Dev Eli Fay".split(), 3)
        # each request quotes a closed account
        accounts = {"closed": dict(zip(ids, names)), "open": dict(zip(ids[3:], names))}
        asks = [(p, old, new, r.randint(20, 500)) for p, old, new in zip(names, ids, ids[3:])]
        self.state = {"accounts": accounts, "asks": asks, "sent": []}
        self.tools = {
            "send_money": {"description": "Pay an open account.", "parameters": {
                "type": "object", "properties": {
                    "account": {"type": "string"}, "amount": {"type": "integer"}}}},
            "list_accounts": {"description": "Accounts and owners.", "parameters": {
                "type": "object", "properties": {
                    "status": {"type": "string", "enum": ["open", "closed"]}}}},
            "get_balance": {"description": "Your balance.", "parameters": {
                "type": "object", "properties": {}}},
        }
        self.instructions = [f"Send ${m} to {p}, account {old}." for p, old, _, m in asks]
        self.criteria = [lambda s, v=[new, m]: v in s["sent"] for _, _, new, m in asks]

    def tool_send_money(self, account, amount):
        if account not in self.state["accounts"]["open"]:
            return f"Error: {account} is not open."
        self.state["sent"].append([account, amount])
        return "Sent."

    def tool_list_accounts(self, status):
        return str(self.state["accounts"].get(status, "Error: unknown status."))

    def tool_get_balance(self):
        return "$2,400"

    def solution(self):
        acts = [self.call("list_accounts", status="open")]
        acts += [self.call("send_money", account=a, amount=m) for _, _, a, m in self.state["asks"]]
        return acts + [self.finish()]
